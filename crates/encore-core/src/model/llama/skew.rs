//! Synthetic routing for benchmarks: `--router-skew` routes every sparse layer by a seeded
//! table instead of its router ([`Model::set_router_skew`]), the window of rows a step
//! reads moved on each step.

use super::{Model, RouterTable};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::model::routing::{RouterSkew, RoutingTable};

impl Model {
    /// Route every sparse layer by a synthetic table of `rows` token rows instead of its
    /// router (`--router-skew`; `None`: the routers). Steps captured before keep what
    /// they captured: set it before any graph.
    pub fn set_router_skew(
        &mut self,
        backend: &dyn Backend,
        skew: Option<RouterSkew>,
        rows: usize,
    ) -> Result<()> {
        let Some(skew) = skew else {
            self.router_table = None;
            return Ok(());
        };
        let Some(moe) = &self.cfg.moe else {
            return Err(Error::invalid(
                "--router-skew",
                format!("{} has no experts to route", self.cfg.arch.model_type()),
            ));
        };
        let window = rows + self.cfg.num_layers;
        let len = RoutingTable::table_rows(window);
        let table = RoutingTable::new(skew, moe.num_experts, moe.top_k, len);
        let all = backend.upload_f32_as(&table.logits(), &[len, moe.num_experts], self.dtype())?;
        let window = backend.alloc(self.dtype(), &[window, moe.num_experts])?;
        backend.copy(&all.narrow(0, window.dim(0))?, &window)?;
        // The prefetch's predictions, only where the expert cache prefetches.
        let prefetches = self
            .offload
            .as_ref()
            .is_some_and(|o| o.prefetches_experts());
        let predicted = if prefetches {
            let p_all = backend.upload_f32_as(
                &table.predicted_logits(),
                &[len, moe.num_experts],
                self.dtype(),
            )?;
            let p = backend.alloc(self.dtype(), window.shape())?;
            backend.copy(&p_all.narrow(0, window.dim(0))?, &p)?;
            Some((p_all, p))
        } else {
            None
        };
        self.router_table = Some(RouterTable {
            all,
            window,
            predicted,
            table: std::sync::Arc::new(table),
            next: std::sync::atomic::AtomicUsize::new(0),
        });
        Ok(())
    }

    /// The synthetic routing table, when one is set.
    pub fn routing_table(&self) -> Option<std::sync::Arc<RoutingTable>> {
        self.router_table.as_ref().map(|r| r.table.clone())
    }

    /// Before a step of `rows` token rows (never inside a capture): the synthetic routing
    /// table's window moves to fresh rows ([`RoutingTable::next_start`]), so each step
    /// routes anew, as a real router does, while the graphs read the same window.
    /// Returns the window it took, `(start, rows)`, for the followers of a
    /// tensor-parallel group ([`Model::follow_routing`]); `None` without a table.
    pub fn advance_routing(
        &self,
        backend: &dyn Backend,
        rows: usize,
    ) -> Result<Option<(usize, usize)>> {
        let Some(r) = &self.router_table else {
            return Ok(None);
        };
        let start = r.next.load(std::sync::atomic::Ordering::Relaxed);
        self.route_window(r, backend, start, rows)?;
        Ok(Some((start, rows)))
    }

    /// A tensor-parallel follower's step: the routing window the leader's
    /// [`Model::advance_routing`] took for it (nothing for `None`), so every rank routes
    /// every token alike.
    pub fn follow_routing(
        &self,
        backend: &dyn Backend,
        window: Option<(usize, usize)>,
    ) -> Result<()> {
        let Some((start, rows)) = window else {
            return Ok(());
        };
        let Some(r) = &self.router_table else {
            return Err(Error::invalid(
                "tensor parallel",
                "the leader routes by a table this rank does not have",
            ));
        };
        self.route_window(r, backend, start, rows)
    }

    /// Copy table `r`'s rows from `start` into the window the graphs read, and move the
    /// next step's start past a step of `rows`.
    fn route_window(
        &self,
        r: &RouterTable,
        backend: &dyn Backend,
        start: usize,
        rows: usize,
    ) -> Result<()> {
        let w = r.window.dim(0);
        backend.copy(&r.all.narrow(start, w)?, &r.window)?;
        if let Some((p_all, p)) = &r.predicted {
            backend.copy(&p_all.narrow(start, w)?, p)?;
        }
        let next = RoutingTable::next_start(start, rows, self.cfg.num_layers, w, r.all.dim(0));
        r.next.store(next, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }
}

//! EAGLE-3 around the forward: a target's capture of the residual stream at three layers
//! ([`Model::capture_aux`]), and a head's rows and first piece, which reads them
//! ([`Model::enable_eagle`]).

use super::{AuxCapture, EagleRows, Model, StepBuffers, StepInputs};
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::kv::KvCache;
use crate::tensor::Tensor;

impl Model {
    /// Capture, in every later step (eager or captured: call it before any graph), the
    /// residual stream at the input of `layers` for each of up to `rows` token rows, the
    /// hidden states an EAGLE-3 head reads ([`Model::aux_hidden`]).
    pub fn capture_aux(&mut self, be: &dyn Backend, layers: [usize; 3], rows: usize) -> Result<()> {
        if let Some(&l) = layers.iter().find(|&&l| l >= self.cfg.num_layers) {
            return Err(Error::invalid(
                "capture_aux",
                format!("layer {l} of a model of {} layers", self.cfg.num_layers),
            ));
        }
        let buf = be.alloc(self.dtype(), &[3 * rows, self.cfg.hidden_size])?;
        self.aux = Some(AuxCapture { layers, buf, rows });
        Ok(())
    }

    /// Whether steps capture hidden states ([`Model::capture_aux`]).
    pub fn captures_aux(&self) -> bool {
        self.aux.is_some()
    }

    /// The captured hidden states of the last step ([`Model::capture_aux`]): `[rows,
    /// hidden]` per layer, in the order the layers were given; `None` without a capture.
    pub fn aux_hidden(&self) -> Option<[Tensor; 3]> {
        let a = self.aux.as_ref()?;
        let block = |k: usize| a.buf.narrow(k * a.rows, a.rows).ok();
        Some([block(0)?, block(1)?, block(2)?])
    }

    /// An EAGLE-3 head's persistent rows for steps of up to `rows` token rows and `seqs`
    /// sampled rows (call it before any graph), and the target's embedding it shares
    /// (`[target_vocab, hidden]` in the run dtype).
    pub fn enable_eagle(
        &mut self,
        be: &dyn Backend,
        embed: &Tensor,
        rows: usize,
        seqs: usize,
    ) -> Result<()> {
        let Some(e) = &self.cfg.eagle else {
            return Err(Error::invalid(
                "enable_eagle",
                "the model is not an EAGLE head",
            ));
        };
        let h = self.cfg.hidden_size;
        let want = [e.target_vocab, h];
        if embed.shape() != want || embed.dtype() != self.dtype() {
            return Err(Error::invalid(
                "--draft-model",
                format!(
                    "the EAGLE head needs the target's embedding as {} {want:?}, the target has {} {:?}",
                    self.dtype(),
                    embed.dtype(),
                    embed.shape()
                ),
            ));
        }
        self.weights.embed = embed.clone();
        self.eagle = Some(EagleRows {
            input: be.alloc(self.dtype(), &[rows, h])?,
            next: be.alloc(self.dtype(), &[seqs, h])?,
        });
        Ok(())
    }

    /// An EAGLE-3 head's input hidden rows and sampled rows' outputs
    /// ([`Model::enable_eagle`]).
    pub fn eagle_rows(&self) -> Option<(&Tensor, &Tensor)> {
        self.eagle.as_ref().map(|e| (&e.input, &e.next))
    }

    /// An EAGLE-3 head's piece 0: the shared embedding of the step's tokens and the
    /// hidden state of each row ([`Model::eagle_rows`]' input), each RMS-normed, side by
    /// side into the layer's q/k/v; the residual stream starts at the hidden state (after
    /// its norm with `norm_before_residual`).
    pub(super) fn eagle_prologue(
        &self,
        be: &dyn Backend,
        kv: &KvCache,
        inp: &StepInputs<'_>,
        buf: &StepBuffers,
    ) -> Result<()> {
        let c = &self.cfg;
        let (Some(e), Some(rows)) = (&c.eagle, &self.eagle) else {
            return Err(Error::invalid(
                "forward",
                "an EAGLE head runs after Model::enable_eagle gave it the target's embedding",
            ));
        };
        let l = &self.weights.layers[0];
        let hidden_norm = l.hidden_norm().ok_or_else(|| {
            Error::invalid("forward", "an EAGLE head without its hidden_norm weight")
        })?;
        let n = buf.hidden.dim(0);
        let eps = c.rms_norm_eps;
        be.embedding(inp.token_ids, &self.weights.embed, &buf.hidden)?;
        let pair = &buf.eagle_pair;
        let (normed_e, normed_h) = (pair.narrow(0, 1)?, pair.narrow(1, 1)?);
        let (normed_e, normed_h) = (
            normed_e.reshape(&[n, c.hidden_size])?,
            normed_h.reshape(&[n, c.hidden_size])?,
        );
        let input_norm = l
            .input_norm()
            .ok_or_else(|| Error::invalid("eagle", "the head's layer has no input norm"))?;
        be.rms_norm(&buf.hidden, None, input_norm.into(), eps, &normed_e)?;
        let input = rows.input.prefix(n)?;
        be.rms_norm(&input, None, hidden_norm.into(), eps, &normed_h)?;
        let start = if e.norm_before_residual {
            &normed_h
        } else {
            &input
        };
        be.copy(start, &buf.residual)?;
        be.unshard_columns(pair, &buf.eagle_cat)?;
        self.qkv_write(be, kv, inp, buf, 0, None)
    }
}

//! GPTQ act order's permutations ([`IntPacking::act_order`](crate::model::formats::IntPacking)):
//! a layer's [`Role::QkvPerm`] .. tensors, made at load from its projection's g_idx.

use super::{Source, TensorDecl};
use crate::error::{Error, Result};
use crate::model::decl::Decl;

/// The permutation `m` ([`Role::permutes`](crate::model::decl::Role::permutes)) holds: the
/// one every part of its projection was sorted by (their g_idx must give the same order:
/// q/k/v and gate/up run as one matmul of one input order), the identity where the
/// projection is not packed in act order (a dummy model, a plain tensor).
pub(super) fn perm(source: &Source, decl: &Decl, m: &TensorDecl) -> Result<Vec<i32>> {
    let len = m.shape.first().copied().unwrap_or(0);
    let identity = || (0..len as i32).collect::<Vec<i32>>();
    let Source::Checkpoint(ck) = source else {
        return Ok(identity());
    };
    let Some(proj) = decl
        .tensors()
        .iter()
        .find(|t| Some(t.role) == m.role.permutes() && t.layer == m.layer)
    else {
        return Err(Error::invalid(
            "weights",
            format!("{}: no projection of it is declared", m.name()),
        ));
    };
    let mut found: Option<(String, Vec<i32>)> = None;
    for part in &proj.parts {
        let p = match ck.read_packed_int(part, false)? {
            Some(w) => w.perm(),
            None => None,
        }
        .unwrap_or_else(identity);
        if p.len() != len {
            return Err(Error::Weights {
                tensor: part.name.clone(),
                what: format!(
                    "orders {} input columns, but {} multiplies {len}",
                    p.len(),
                    proj.name()
                ),
            });
        }
        match &found {
            Some((first, q)) if *q != p => {
                return Err(Error::Weights {
                    tensor: part.name.clone(),
                    what: format!(
                        "has another activation order (g_idx) than `{first}`: encore runs \
                         them as one matmul (`{}`) of one input order, so their g_idx must \
                         sort the columns alike",
                        proj.name()
                    ),
                })
            }
            Some(_) => {}
            None => found = Some((part.name.clone(), p)),
        }
    }
    Ok(found.map_or_else(identity, |(_, p)| p))
}

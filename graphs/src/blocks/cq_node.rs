//! A Needle op node that reads a CQ matrix as the `.cact` stores it: its inputs include
//! the matrix's codes, norms and codebook, its attributes include `cols`, `group`, `bits`
//! (`kernel-ops` reads them as one `CqLayout`).

use crate::blocks::weights::CqRows;
use crate::builder::{Attr, Attrs, GraphBuilder, Value};
use crate::contract::needle_ops;
use crate::onnx::data_type;

/// A node of op `ty` reading `first`, the matrix `w` (codes, norms, codebook; `cols`,
/// `group`, `bits` besides `attrs`) and then `optional`, the op's optional inputs.
pub(crate) fn cq_node(
    b: &mut GraphBuilder,
    ty: &str,
    first: &[&Value],
    w: &CqRows,
    stored: &[Value; 2],
    attrs: Attrs,
    optional: &[&Value],
) -> Value {
    cq_node_outputs(b, ty, first, w, stored, attrs, optional, 1).remove(0)
}

/// [`cq_node`] with `outputs` outputs.
#[allow(clippy::too_many_arguments)]
pub(crate) fn cq_node_outputs(
    b: &mut GraphBuilder,
    ty: &str,
    first: &[&Value],
    w: &CqRows,
    [codes, norms]: &[Value; 2],
    mut attrs: Attrs,
    optional: &[&Value],
    outputs: usize,
) -> Vec<Value> {
    let codebook_raw = w.codebook.iter().flat_map(|v| v.to_le_bytes()).collect();
    let codebook = b.weight_bytes(
        "codebook",
        data_type::FLOAT,
        &[w.codebook.len()],
        codebook_raw,
    );
    attrs.extend([
        ("cols", Attr::Int(w.cols as i64)),
        ("group", Attr::Int(w.group as i64)),
        ("bits", Attr::Int(w.index_bits as i64)),
    ]);
    let inputs: Vec<&Value> = first
        .iter()
        .copied()
        .chain([codes, norms, &codebook])
        .chain(optional.iter().copied())
        .collect();
    b.op_in(needle_ops::DOMAIN, ty, &inputs, attrs, outputs)
}

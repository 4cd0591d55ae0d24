//! Depth ladder rungs (upstream `ladder_layer_indices`, `ladder_slice`, `ladder_config`):
//! every depth from 2 to `num_layers` is a trained sub-network that keeps both end blocks
//! and adds interior blocks by bisecting the largest remaining gap. A rung is an ordinary
//! smaller model: its layers, their hyper-connection rows and the engram sites on them.
//!
//! A `.cact` does not record a `ladder_order`, so the order is always the bisection of
//! its own depth (as upstream's is for every checkpoint that was not itself sliced).

use super::{Config, ProbeHead, Weights};
use crate::blocks::weights::{MhcWeights, Tensor};

/// The blocks of an `num_layers`-deep model in the order the ladder adds them.
pub fn bisection_order(num_layers: usize) -> Vec<usize> {
    if num_layers <= 1 {
        return vec![0; num_layers];
    }
    let mut selected = vec![0, num_layers - 1];
    let mut order = selected.clone();
    while order.len() < num_layers {
        selected.sort_unstable();
        // The widest gap, the leftmost of equally wide ones (upstream's key (gap, -left)).
        let (left, right) = selected
            .windows(2)
            .map(|w| (w[0], w[1]))
            .filter(|(l, r)| r - l > 1)
            .fold(None, |best: Option<(usize, usize)>, (l, r)| match best {
                Some((bl, br)) if br - bl >= r - l => Some((bl, br)),
                _ => Some((l, r)),
            })
            .expect("fewer blocks chosen than there are leaves a gap");
        let middle = (left + right) / 2;
        selected.push(middle);
        order.push(middle);
    }
    order
}

/// The original indices of the blocks rung `depth` keeps, ascending; an error unless
/// `2 <= depth <= num_layers`.
pub fn rung_layers(num_layers: usize, depth: usize) -> Result<Vec<usize>, String> {
    if !(2..=num_layers).contains(&depth) {
        return Err(format!(
            "a ladder rung has 2 to {num_layers} layers (the model's depth), not {depth}"
        ));
    }
    let mut kept = bisection_order(num_layers);
    kept.truncate(depth);
    kept.sort_unstable();
    Ok(kept)
}

/// The `depth`-layer rung of a model: its config and weights.
pub fn rung(cfg: &Config, weights: &Weights, depth: usize) -> Result<(Config, Weights), String> {
    let common = &cfg.common;
    let kept = rung_layers(common.num_layers, depth)?;
    let new_index = |layer: usize| kept.iter().position(|&k| k == layer);
    let old_sites = &common.engram.sites;
    let sites: Vec<usize> = (0..old_sites.len())
        .filter(|&s| new_index(old_sites[s]).is_some())
        .collect();
    let mut config = Config {
        source_layers: kept.iter().map(|&l| cfg.source_layers[l]).collect(),
        global_layers: cfg
            .global_layers
            .iter()
            .filter_map(|&l| new_index(l))
            .collect(),
        ..cfg.clone()
    };
    config.common.num_layers = depth;
    config.common.engram.sites = sites
        .iter()
        .filter_map(|&s| new_index(old_sites[s]))
        .collect();
    let lanes = common.mhc_lanes;
    let m = &weights.mhc;
    let mhc = MhcWeights {
        a_pre: rows(&m.a_pre, &kept, 1),
        a_post: rows(&m.a_post, &kept, 1),
        a_res: rows(&m.a_res, &kept, 1),
        b_pre: rows(&m.b_pre, &kept, 1),
        b_post: rows(&m.b_post, &kept, 1),
        b_res: rows(&m.b_res, &kept, 1),
        phi_pre: rows(&m.phi_pre, &kept, lanes),
        phi_post: rows(&m.phi_post, &kept, lanes),
        phi_res: rows(&m.phi_res, &kept, lanes * lanes),
    };
    let weights = Weights {
        embedding: weights.embedding.clone(),
        layers: kept.iter().map(|&l| weights.layers[l].clone()).collect(),
        mhc,
        hada_p1: weights.hada_p1.clone(),
        hada_p2: weights.hada_p2.clone(),
        engrams: sites.iter().map(|&s| weights.engrams[s].clone()).collect(),
        final_norm: weights.final_norm.clone(),
        confidence: weights.confidence.as_ref().map(|h| head_rows(h, &kept)),
    };
    Ok((config, weights))
}

/// A probe head's rows for the kept blocks (row 0 is the embedding, row `l + 1` block `l`).
fn head_rows(h: &ProbeHead, kept: &[usize]) -> ProbeHead {
    let kept_rows: Vec<usize> = std::iter::once(0)
        .chain(kept.iter().map(|&l| l + 1))
        .collect();
    let q = h.row_bias.shape[0];
    let per_query = h.row_bias.shape[1..].iter().product::<usize>();
    let mut row_bias = Tensor::dense(vec![q, kept_rows.len(), h.row_bias.shape[2]], Vec::new());
    for qi in 0..q {
        let one = Tensor::dense(
            h.row_bias.shape[1..].to_vec(),
            h.row_bias.data[qi * per_query..(qi + 1) * per_query].to_vec(),
        );
        row_bias.data.extend(rows(&one, &kept_rows, 1).data);
    }
    ProbeHead {
        probes: rows(&h.probes, &kept_rows, 1),
        gain: rows(&h.gain, &kept_rows, 1),
        row_bias,
        ..h.clone()
    }
}

/// The rows of a tensor stacked over layers, `per_layer` outermost rows per layer,
/// for the layers in `kept`.
fn rows(t: &Tensor, kept: &[usize], per_layer: usize) -> Tensor {
    let row: usize = t.shape[1..].iter().product();
    let block = row * per_layer;
    let mut data = Vec::with_capacity(block * kept.len());
    for &l in kept {
        data.extend_from_slice(&t.data[l * block..(l + 1) * block]);
    }
    let mut shape = t.shape.clone();
    shape[0] = per_layer * kept.len();
    Tensor::dense(shape, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rungs_are_upstreams() {
        // _ladder_layer_order(n) and ladder_layer_indices(20, d) in cactus-needle 3.2.8.
        let order_20 = [
            0, 19, 9, 14, 4, 6, 11, 16, 2, 7, 12, 17, 1, 3, 5, 8, 10, 13, 15, 18,
        ];
        assert_eq!(bisection_order(20), order_20);
        assert_eq!(bisection_order(7), [0, 6, 3, 1, 4, 2, 5]);
        assert_eq!(bisection_order(12), [0, 11, 5, 8, 2, 3, 6, 9, 1, 4, 7, 10]);
        assert_eq!(bisection_order(2), [0, 1]);
        assert_eq!(rung_layers(20, 2).unwrap(), [0, 19]);
        assert_eq!(rung_layers(20, 5).unwrap(), [0, 4, 9, 14, 19]);
        assert_eq!(rung_layers(20, 6).unwrap(), [0, 4, 6, 9, 14, 19]);
        assert_eq!(rung_layers(20, 20).unwrap(), (0..20).collect::<Vec<_>>());
        assert!(rung_layers(20, 1).is_err());
        assert!(rung_layers(20, 21).is_err());
    }
}

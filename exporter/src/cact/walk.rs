//! The positional tensor walk evaluated for one header: which tensors it stores, their
//! shapes as numbers (overflow named by header field), and the directory slots.

use super::directory::Slot;
use super::header::RawHeader;
use super::layout::{Repeat, TensorGroup, TensorSpec};
use super::CactError;

/// Number of copies of `group` the header asks for.
fn copies(group: &TensorGroup, header: &RawHeader<'_>) -> u64 {
    match group.repeat {
        Repeat::Once => 1,
        Repeat::Indexed { count, .. } => header.u32(count).into(),
    }
}

/// The tensors of `group` this header stores.
fn stored<'g>(group: &'g TensorGroup, header: &RawHeader<'_>) -> Vec<&'g TensorSpec> {
    group
        .tensors
        .iter()
        .filter(|t| t.when.is_none_or(|field| header.u32(field) != 0))
        .collect()
}

/// The value of one symbolic dimension, or the error naming the header field
/// whose factor overflows 64 bits (only products of several factors can).
fn dimension(dim: &str, header: &RawHeader<'_>) -> Result<u64, CactError> {
    let layout = header.layout();
    let mut value = 1u64;
    let mut last_field = None;
    for factor in dim.split('*') {
        let size = match layout.find(factor) {
            Some(index) => {
                last_field = Some(layout.fields[index].name);
                header.u32(factor).into()
            }
            None => factor
                .parse::<u64>()
                .ok()
                .or_else(|| {
                    let derived = layout.derived.iter().find(|d| d.name == factor);
                    derived.map(|d| (d.size)(header.u32(d.field).into()))
                })
                .expect("a walk names only header fields, literals and its derived sizes"),
        };
        value = value.checked_mul(size).ok_or_else(|| {
            let field = last_field.unwrap_or(layout.fields[0].name);
            header.bad(
                field,
                header.u32(field),
                format!("small enough that {} fits in 64 bits", product_text(dim)),
            )
        })?;
    }
    Ok(value)
}

/// `a*b*b` as `a * b^2`.
fn product_text(dim: &str) -> String {
    let mut runs: Vec<(&str, usize)> = Vec::new();
    for factor in dim.split('*') {
        match runs.last_mut() {
            Some((last, n)) if *last == factor => *n += 1,
            _ => runs.push((factor, 1)),
        }
    }
    let terms: Vec<String> = runs
        .iter()
        .map(|&(f, n)| {
            if n == 1 {
                f.to_string()
            } else {
                format!("{f}^{n}")
            }
        })
        .collect();
    terms.join(" * ")
}

/// Number of tensors the fixed walk `walk` holds for this header.
pub(crate) fn core_count(walk: &[TensorGroup], header: &RawHeader<'_>) -> u64 {
    walk.iter()
        .map(|g| stored(g, header).len() as u64 * copies(g, header))
        .sum()
}

/// Slots of the fixed walk `walk`; call only once `num_tensors` is known to fit in
/// the file, since this allocates [`core_count`] slots. Every shape is evaluated
/// before any slot is built, so an overflowing dimension is reported before anything
/// else about the walk.
pub(crate) fn core_slots(
    walk: &[TensorGroup],
    header: &RawHeader<'_>,
) -> Result<Vec<Slot>, CactError> {
    let groups = walk
        .iter()
        .map(|g| {
            stored(g, header)
                .into_iter()
                .map(|t| {
                    let shape = t.shape.iter().map(|d| dimension(d, header));
                    Ok((t.name, shape.collect::<Result<Vec<u64>, CactError>>()?))
                })
                .collect::<Result<Vec<_>, CactError>>()
        })
        .collect::<Result<Vec<_>, CactError>>()?;
    let mut out = Vec::with_capacity(core_count(walk, header) as usize);
    for (group, tensors) in walk.iter().zip(&groups) {
        for index in 0..copies(group, header) as usize {
            for (name, shape) in tensors {
                out.push(Slot::float(group.tensor_name(index, name), shape));
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cact::layout::HeaderLayout;
    use crate::cact::{needle2, needle3};

    #[test]
    fn walks_name_header_fields_literals_and_derived_sizes_only() {
        let layouts: [(HeaderLayout, &[TensorGroup]); 2] = [
            (needle2::layout::HEADER, &needle2::layout::CORE_WALK),
            (needle3::layout::HEADER, &needle3::layout::CORE_WALK),
        ];
        for (layout, walk) in layouts {
            for group in walk {
                if let Repeat::Indexed { count, .. } = group.repeat {
                    assert!(layout.find(count).is_some(), "{count}");
                }
                for factor in group
                    .tensors
                    .iter()
                    .flat_map(|t| t.shape)
                    .flat_map(|d| d.split('*'))
                {
                    let derived = layout.derived.iter().any(|d| d.name == factor);
                    assert!(
                        factor.parse::<u64>().is_ok() || layout.find(factor).is_some() || derived,
                        "{}: {factor}",
                        group.tensors[0].name
                    );
                }
            }
        }
    }

    #[test]
    fn products_read_as_powers() {
        assert_eq!(
            product_text("num_layers*mhc_lanes*mhc_lanes"),
            "num_layers * mhc_lanes^2"
        );
        assert_eq!(product_text("d_model"), "d_model");
    }
}

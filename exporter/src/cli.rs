//! Command-line parsing of the contract's enums, shared by `needle-export` and `needle-run`:
//! the accepted words are the enums' one spelling (`graphs::contract::Spelled`).

use clap::builder::{PossibleValuesParser, TypedValueParser};
use graphs::contract::{parse_spelled, Spelled};

/// A clap value parser accepting exactly `T`'s spellings (listed in `--help`).
pub fn spelled<T: Spelled + Send + Sync + Clone>() -> impl TypedValueParser<Value = T> {
    PossibleValuesParser::new(T::ALL.iter().map(|v| v.name()))
        .map(|name| parse_spelled::<T>(&name).expect("clap checked it is one of T's names"))
}

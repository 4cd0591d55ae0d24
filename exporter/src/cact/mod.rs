//! Readers for Needle `.cact` files, one per generation ([`needle2`]: `cactus-needle==2.0.15`,
//! [`needle3`]: `cactus-needle==3.2.8`), each validating a file completely before anything
//! is dequantized. What both share sits here: byte reads, the header's common fields and
//! checks, the codebooks, directory records, the walk, CQ decoding, the tokenizer blob,
//! and the tag that says which reader takes a file.

pub(crate) mod bytes;
pub mod codebooks;
mod cq;
pub mod directory;
pub mod error;
pub mod header;
pub mod layout;
pub mod limits;
pub mod needle2;
pub mod needle3;
pub mod tag;
mod tensors;
pub mod tokenizer_blob;
mod walk;
mod weights;

pub use codebooks::Codebooks;
pub use directory::{Encoding, Entry};
pub use error::CactError;
pub use header::CommonHeader;
pub use needle2::Needle2File;
pub use needle3::Needle3File;
pub use tag::{file_generation, generation_of, NEEDLE2_TAG, NEEDLE3_TAG};
pub use tokenizer_blob::{Piece, PieceKind, TokenizerSpec};

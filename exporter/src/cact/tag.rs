//! The first u32 of a `.cact` file names its generation: the one place that maps a tag
//! to the generation whose reader takes the file.

use super::bytes::Reader;
use super::CactError;
use graphs::contract::Generation;

/// First u32 of a Needle 2 `.cact` (`cactus-needle==2.0.15`).
pub const NEEDLE2_TAG: u32 = 0x05E1_2A83;
/// First u32 of a Needle 3 `.cact` (`cactus-needle==3.2.8`).
pub const NEEDLE3_TAG: u32 = 0x05E1_2A84;

/// The generation a `.cact` tag names; an error for a generation this build cannot read.
pub fn generation_of(tag: u32) -> Result<Generation, CactError> {
    match tag {
        NEEDLE2_TAG => Ok(Generation::Needle2),
        NEEDLE3_TAG => Ok(Generation::Needle3),
        found => Err(CactError::BadTag { found }),
    }
}

/// The generation of the file whose bytes are `file`, read from its tag.
pub fn file_generation(file: &[u8]) -> Result<Generation, CactError> {
    generation_of(read_tag(&mut Reader::new(file, 0))?)
}

fn read_tag(r: &mut Reader<'_>) -> Result<u32, CactError> {
    r.u32(|| "header tag".to_string())
}

/// Reads the tag at the start of `r` and refuses a file that is not of `generation`,
/// the reader's own.
pub(crate) fn expect_generation(
    r: &mut Reader<'_>,
    generation: Generation,
) -> Result<(), CactError> {
    let found = generation_of(read_tag(r)?)?;
    if found != generation {
        return Err(CactError::OtherGeneration {
            found,
            reader: generation,
        });
    }
    Ok(())
}

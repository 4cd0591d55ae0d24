//! The files of one export (each graph and the `tokenizer.json` beside them, or an
//! onnxruntime-genai folder), checked before anything is read and written atomically: a
//! temporary file in the destination directory, renamed into place.

use crate::export::ExportOptions;
use crate::genai;
use crate::model::NeedleModel;
use crate::tokenizer::{NeedleTokenizer, IM_END};
use anyhow::{bail, Context, Result};
use graphs::contract::{
    AttentionKind, MatMulWeights, ModelConfig, Precision, RuntimeTarget, Variant,
};
use std::io::Write;
use std::path::{Path, PathBuf};

/// Where one export goes: `OUT.onnx` for the first graph, `OUT.reference.onnx` for a
/// reference graph beside a fused one, `OUT.tokenizer.json` for the tokenizer; or an
/// onnxruntime-genai folder.
#[derive(Clone, Debug)]
pub struct ExportFiles {
    pub graphs: Vec<(AttentionKind, PathBuf)>,
    pub tokenizer: PathBuf,
    /// The folder of an onnxruntime-genai export (one graph), which also gets
    /// `genai_config.json`, genai's `tokenizer.json` and `tokenizer_config.json`.
    pub genai_dir: Option<PathBuf>,
}

impl ExportFiles {
    /// The files for `attentions` (one, or fused then reference) named after `out`.
    pub fn beside(out: &Path, attentions: &[AttentionKind]) -> Self {
        let graphs = attentions
            .iter()
            .enumerate()
            .map(|(i, &kind)| match i {
                0 => (kind, out.to_path_buf()),
                _ => (kind, out.with_extension(format!("{kind}.onnx"))),
            })
            .collect();
        ExportFiles {
            graphs,
            tokenizer: out.with_extension("tokenizer.json"),
            genai_dir: None,
        }
    }

    /// An onnxruntime-genai folder `dir` with the `attention` graph as `model.onnx` and
    /// its tokenizer beside it as `model.tokenizer.json`.
    pub fn genai_folder(dir: &Path, attention: AttentionKind) -> Self {
        let graph = dir.join(genai::MODEL_FILE);
        ExportFiles {
            tokenizer: graph.with_extension("tokenizer.json"),
            graphs: vec![(attention, graph)],
            genai_dir: Some(dir.to_path_buf()),
        }
    }

    /// `genai_config.json`, `tokenizer.json` and `tokenizer_config.json` of a genai folder.
    fn genai_files(&self) -> Vec<PathBuf> {
        let files = [
            genai::CONFIG_FILE,
            genai::TOKENIZER_FILE,
            genai::TOKENIZER_CONFIG_FILE,
        ];
        let dir = self.genai_dir.iter();
        dir.flat_map(|d| files.map(|f| d.join(f))).collect()
    }

    fn paths(&self) -> Vec<PathBuf> {
        let graphs = self.graphs.iter().map(|(_, p)| p.clone());
        graphs
            .chain([self.tokenizer.clone()])
            .chain(self.genai_files())
            .collect()
    }

    /// Refuses to write over `input`, and over an existing file unless `force`.
    pub fn check(&self, input: &Path, force: bool) -> Result<()> {
        for out in &self.paths() {
            if let (Ok(a), Ok(b)) = (input.canonicalize(), out.canonicalize()) {
                if a == b {
                    bail!("{}: refusing to write over the input model", out.display());
                }
            }
            if out.exists() && !force {
                bail!(
                    "{}: already exists (use --force to replace it)",
                    out.display()
                );
            }
        }
        Ok(())
    }

    /// Exports `model` into these files with `precision` and `matmul_weights` for the
    /// onnxruntime releases of `runtime`, beside `tokenizer` (built from the model's, with
    /// the whitespace rule the graphs record). Nothing is written for a graph the model
    /// cannot be exported as. Returns each path written and its size.
    pub fn write(
        &self,
        model: &NeedleModel,
        tokenizer: &NeedleTokenizer,
        precision: Precision,
        matmul_weights: MatMulWeights,
        runtime: RuntimeTarget,
    ) -> Result<Vec<(PathBuf, usize)>> {
        let tokenizer_file = file_name(&self.tokenizer);
        let options: Vec<ExportOptions> = self
            .graphs
            .iter()
            .map(|(attention, _)| ExportOptions {
                variant: Variant {
                    attention: *attention,
                    precision,
                    matmul_weights,
                    runtime,
                },
                tokenizer_file: Some(tokenizer_file.clone()),
                remove_extra_whitespaces: tokenizer.remove_extra_whitespaces(),
            })
            .collect();
        for opts in &options {
            if let Err(e) = model.describe(opts).check() {
                bail!("{}: {e}", model.source.file_name);
            }
        }
        if let Some(dir) = &self.genai_dir {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("{}: cannot create the folder", dir.display()))?;
        }
        let mut written = Vec::new();
        for (opts, (_, path)) in options.iter().zip(&self.graphs) {
            let onnx = model.export(opts);
            write_atomically(path, &onnx)
                .with_context(|| format!("{}: cannot write", path.display()))?;
            written.push((path.clone(), onnx.len()));
            if self.genai_dir.is_some() {
                written.extend(write_genai_files(
                    model,
                    tokenizer,
                    opts,
                    &self.genai_files(),
                )?);
            }
        }
        let json = tokenizer.to_json();
        write_atomically(&self.tokenizer, json.as_bytes())
            .with_context(|| format!("{}: cannot write", self.tokenizer.display()))?;
        written.push((self.tokenizer.clone(), json.len()));
        Ok(written)
    }
}

/// The genai files for the graph `opts` exports, into `paths` (config, tokenizer, tokenizer
/// config).
fn write_genai_files(
    model: &NeedleModel,
    tokenizer: &NeedleTokenizer,
    opts: &ExportOptions,
    paths: &[PathBuf],
) -> Result<Vec<(PathBuf, usize)>> {
    let desc = model.describe(opts);
    let ModelConfig::Needle2(config) = &desc.config else {
        bail!("onnxruntime-genai folders are written for Needle 2 models only");
    };
    let t = &desc.tokenizer;
    let mut stop_ids = vec![t.eos_id];
    stop_ids.extend(tokenizer.token_id(IM_END));
    let piece = |id: u32| {
        let pieces = &model.tokenizer.pieces;
        pieces
            .get(id as usize)
            .map(|p| p.text.clone())
            .unwrap_or_default()
    };
    let special = genai::SpecialPieces {
        bos: piece(t.bos_id),
        eos: piece(t.eos_id),
        unk: piece(t.unk_id),
        pad: piece(t.pad_id),
    };
    let texts = [
        genai::config(&desc, config, &stop_ids),
        genai::tokenizer::tokenizer_json(tokenizer, &model.tokenizer)?,
        genai::tokenizer_config(&desc, &special),
    ];
    let mut written = Vec::new();
    for (path, text) in paths.iter().zip(texts) {
        write_atomically(path, text.as_bytes())
            .with_context(|| format!("{}: cannot write", path.display()))?;
        written.push((path.clone(), text.len()));
    }
    Ok(written)
}

/// The last component of `p`, or "" when it has none.
pub fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Writes `bytes` to `path` so that readers see either the old file or the whole new
/// one; on failure the temporary file is removed and `path` is untouched.
pub fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("not a file path"))?;
    let tmp = dir.join(format!(
        ".{}.tmp{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

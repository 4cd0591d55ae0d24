//! The files of one export (each graph and the `tokenizer.json` beside them, or an
//! onnxruntime-genai folder): every destination is checked before anything is read
//! ([`target`]), and the whole set is written all or nothing ([`staging`]).

pub mod interrupt;
mod staging;
pub mod target;

use crate::export::ExportOptions;
use crate::genai;
use crate::model::{file_name, sha256_hex, NeedleModel};
use crate::tokenizer::{NeedleTokenizer, IM_END};
use anyhow::{bail, Result};
use graphs::accelerator::{self, PREFILL_CHUNK};
use graphs::config::ModelConfig;
use graphs::contract::{
    AcceleratorTarget, AttentionKind, MatMulWeights, Precision, RuntimeTarget, Variant,
};
use graphs::description::TokenizerFile;
use graphs::encoding::{externalize, write_model};
use staging::Staging;
use std::path::{Path, PathBuf};
use target::Existing;

/// One graph of an export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Graph {
    /// A stock graph with this attention variant.
    Stock(AttentionKind),
    /// An accelerator graph (`graphs::accelerator`) taking `sequence` tokens a call.
    Accelerator {
        target: AcceleratorTarget,
        sequence: usize,
    },
}

/// Where one export goes: `OUT.onnx` for the first graph, `OUT.reference.onnx` for a
/// reference graph beside a fused one (`OUT.prefill.onnx` for an accelerator's prefill
/// graph beside its decode graph), `OUT.tokenizer.json` for the tokenizer; or an
/// onnxruntime-genai folder.
#[derive(Clone, Debug)]
pub struct ExportFiles {
    pub graphs: Vec<(Graph, PathBuf)>,
    pub tokenizer: PathBuf,
    /// The folder of an onnxruntime-genai export (one graph), which also gets
    /// `genai_config.json`, genai's `tokenizer.json` and `tokenizer_config.json`.
    pub genai_dir: Option<PathBuf>,
    /// Whether each graph's large initializers go to a data file beside it
    /// ([`data_file`]; ONNX external data) instead of inside it.
    pub external_data: bool,
}

/// The external-data file of `graph`: `OUT.onnx.data` beside `OUT.onnx`.
pub fn data_file(graph: &Path) -> PathBuf {
    let mut name = graph.as_os_str().to_owned();
    name.push(".data");
    PathBuf::from(name)
}

impl ExportFiles {
    /// The files for `attentions` (one, or fused then reference) named after `out`.
    pub fn beside(out: &Path, attentions: &[AttentionKind]) -> Self {
        let graphs = attentions
            .iter()
            .enumerate()
            .map(|(i, &kind)| match i {
                0 => (Graph::Stock(kind), out.to_path_buf()),
                _ => (
                    Graph::Stock(kind),
                    out.with_extension(format!("{kind}.onnx")),
                ),
            })
            .collect();
        ExportFiles {
            graphs,
            tokenizer: out.with_extension("tokenizer.json"),
            genai_dir: None,
            external_data: false,
        }
    }

    /// `target`'s accelerator graphs named after `out`: the one-token decode graph as
    /// `OUT.onnx`, the prefill graph (`PREFILL_CHUNK` tokens a call) as `OUT.prefill.onnx`.
    pub fn accelerator(out: &Path, target: AcceleratorTarget) -> Self {
        let decode = Graph::Accelerator {
            target,
            sequence: 1,
        };
        let prefill = Graph::Accelerator {
            target,
            sequence: PREFILL_CHUNK,
        };
        ExportFiles {
            graphs: vec![
                (decode, out.to_path_buf()),
                (prefill, out.with_extension("prefill.onnx")),
            ],
            tokenizer: out.with_extension("tokenizer.json"),
            genai_dir: None,
            external_data: false,
        }
    }

    /// An onnxruntime-genai folder `dir` with the `attention` graph as `model.onnx` and
    /// its tokenizer beside it as `model.tokenizer.json`.
    pub fn genai_folder(dir: &Path, attention: AttentionKind) -> Self {
        let graph = dir.join(genai::MODEL_FILE);
        ExportFiles {
            tokenizer: graph.with_extension("tokenizer.json"),
            graphs: vec![(Graph::Stock(attention), graph)],
            genai_dir: Some(dir.to_path_buf()),
            external_data: false,
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

    /// Each graph's large initializers into a data file beside it ([`data_file`]).
    pub fn with_external_data(self) -> Self {
        ExportFiles {
            external_data: true,
            ..self
        }
    }

    fn paths(&self) -> Vec<PathBuf> {
        let graphs = self.graphs.iter().map(|(_, p)| p.clone());
        let data = self.graphs.iter().filter(|_| self.external_data);
        graphs
            .chain(data.map(|(_, p)| data_file(p)))
            .chain([self.tokenizer.clone()])
            .chain(self.genai_files())
            .collect()
    }

    /// Refuses anything but a regular file or nothing at each destination ([`target`]),
    /// the `input` itself, and an existing file unless `force`. A genai folder must be a
    /// folder (a link to one is a folder like any above it) or not exist yet.
    pub fn check(&self, input: &Path, force: bool) -> Result<()> {
        if let Some(dir) = &self.genai_dir {
            if dir.exists() && !dir.is_dir() {
                bail!("{}: is not a folder", dir.display());
            }
        }
        if self.external_data {
            // A graph names its data file in a UTF-8 string (`location`).
            let mut data_files = self.graphs.iter().map(|(_, p)| data_file(p));
            if let Some(data) =
                data_files.find(|d| d.file_name().and_then(|n| n.to_str()).is_none())
            {
                bail!(
                    "{}: --external-data needs a file name in UTF-8 (the graph names its data file)",
                    data.display()
                );
            }
        }
        let input = std::fs::metadata(input).ok();
        for out in &self.paths() {
            let Existing::RegularFile(existing) = target::inspect(out)? else {
                continue;
            };
            if input
                .as_ref()
                .is_some_and(|i| target::same_file(i, &existing))
            {
                bail!("{}: refusing to write over the input model", out.display());
            }
            if !force {
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
    /// cannot be exported as, and nothing at all unless every file is written (an existing
    /// regular file at a destination is replaced; see [`Self::check`] for what may be).
    /// Returns each path written and its size.
    pub fn write(
        &self,
        model: &NeedleModel,
        tokenizer: &NeedleTokenizer,
        precision: Precision,
        matmul_weights: MatMulWeights,
        runtime: RuntimeTarget,
    ) -> Result<Vec<(PathBuf, usize)>> {
        let json = tokenizer.to_json();
        let tokenizer_file = TokenizerFile {
            name: file_name(&self.tokenizer),
            sha256: Some(sha256_hex(json.as_bytes())),
        };
        let options: Vec<ExportOptions> = self
            .graphs
            .iter()
            .map(|(graph, _)| ExportOptions {
                variant: Variant {
                    attention: match graph {
                        Graph::Stock(attention) => *attention,
                        Graph::Accelerator { .. } => AttentionKind::Reference,
                    },
                    precision,
                    matmul_weights,
                    runtime,
                },
                tokenizer_file: Some(tokenizer_file.clone()),
                remove_extra_whitespaces: tokenizer.remove_extra_whitespaces(),
            })
            .collect();
        for (opts, (graph, _)) in options.iter().zip(&self.graphs) {
            let desc = model.describe(opts);
            let checked = match graph {
                Graph::Stock(_) => desc.check(),
                Graph::Accelerator { target, .. } => accelerator::check(&desc, *target),
            };
            if let Err(e) = checked {
                bail!("{}: {e}", model.source.file_name);
            }
        }
        for path in self.paths() {
            target::inspect(&path)?;
        }
        let mut staging = Staging::default();
        if let Some(dir) = &self.genai_dir {
            staging.create_dir_all(dir)?;
        }
        let mut written = Vec::new();
        staging.stage(&self.tokenizer, json.as_bytes())?;
        written.push((self.tokenizer.clone(), json.len()));
        for (opts, (graph, path)) in options.iter().zip(&self.graphs) {
            let mut onnx = match *graph {
                Graph::Stock(_) => model.graph(opts),
                Graph::Accelerator { target, sequence } => model
                    .accelerator_graph(opts, target, sequence)
                    .map_err(|e| anyhow::anyhow!("{}: {e}", model.source.file_name))?,
            };
            let data = self.external_data.then(|| {
                let data = data_file(path);
                let external = externalize(&mut onnx, &file_name(&data));
                (data, external)
            });
            let len = staging.stage_with(path, |file| write_model(&onnx, file))?;
            written.push((path.clone(), len));
            if let Some((path, external)) = data {
                let len = staging.stage_with(&path, |file| external.write(file))?;
                written.push((path, len));
            }
            if self.genai_dir.is_some() {
                written.extend(stage_genai_files(
                    &mut staging,
                    model,
                    tokenizer,
                    opts,
                    &self.genai_files(),
                )?);
            }
        }
        staging.commit()?;
        Ok(written)
    }
}

/// The genai files for the graph `opts` exports, staged for `paths` (config, tokenizer,
/// tokenizer config).
fn stage_genai_files(
    staging: &mut Staging,
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
        staging.stage(path, text.as_bytes())?;
        written.push((path.clone(), text.len()));
    }
    Ok(written)
}

//! A [`NeedleModel`] → ONNX model bytes: the one export entry point, shared by
//! `needle-export`, the runner's in-memory export, the tests and the benchmarks.

use crate::model::NeedleModel;
use graphs::accelerator;
use graphs::contract::{AcceleratorTarget, Variant};
use graphs::description::{ExportDescription, TokenizerDescription, TokenizerFile};
use graphs::model::build;
use graphs::onnx::ModelProto;
use prost::Message;

/// What a caller asks of one export.
#[derive(Clone, Debug)]
pub struct ExportOptions {
    pub variant: Variant,
    /// The tokenizer written beside the graph (name and checksum), recorded in metadata.
    pub tokenizer_file: Option<TokenizerFile>,
    /// The tokenizer's whitespace rule (sentencepiece `remove_extra_whitespaces`), recorded in metadata.
    pub remove_extra_whitespaces: bool,
}

impl ExportOptions {
    /// An in-memory export of `variant` (no tokenizer file) with sentencepiece's default
    /// whitespace rule.
    pub fn in_memory(variant: Variant) -> Self {
        ExportOptions {
            variant,
            tokenizer_file: None,
            remove_extra_whitespaces: true,
        }
    }
}

impl NeedleModel {
    /// What the graph exported with `opts` says about itself.
    pub fn describe(&self, opts: &ExportOptions) -> ExportDescription {
        let t = &self.tokenizer;
        ExportDescription::new(
            self.config.clone(),
            opts.variant,
            self.source.clone(),
            TokenizerDescription {
                file: opts.tokenizer_file.clone(),
                add_dummy_prefix: t.add_dummy_prefix,
                remove_extra_whitespaces: opts.remove_extra_whitespaces,
                pad_id: t.pad_id,
                eos_id: t.eos_id,
                bos_id: t.bos_id,
                unk_id: t.unk_id,
            },
        )
        .with_confidence_pools(self.weights.confidence_pools())
    }

    /// The graph of one variant.
    pub fn graph(&self, opts: &ExportOptions) -> ModelProto {
        build(&self.describe(opts), &self.weights)
    }

    /// The serialized graph of one variant.
    pub fn export(&self, opts: &ExportOptions) -> Vec<u8> {
        self.graph(opts).encode_to_vec()
    }

    /// The accelerator graph for `target` that takes `sequence` tokens a call
    /// (`graphs::accelerator`), or why the model has none.
    pub fn accelerator_graph(
        &self,
        opts: &ExportOptions,
        target: AcceleratorTarget,
        sequence: usize,
    ) -> Result<ModelProto, String> {
        let desc = self.describe(opts);
        accelerator::check(&desc, target)?;
        Ok(accelerator::build(&desc, &self.weights, target, sequence))
    }

    /// The serialized accelerator graph (see [`Self::accelerator_graph`]).
    pub fn export_accelerator(
        &self,
        opts: &ExportOptions,
        target: AcceleratorTarget,
        sequence: usize,
    ) -> Result<Vec<u8>, String> {
        Ok(self
            .accelerator_graph(opts, target, sequence)?
            .encode_to_vec())
    }
}

//! Sessions of packed graphs created on several threads at once as the process's first
//! sessions (this binary has no other test, so none came before): each must load. A
//! custom domain's first registration in onnxruntime is an unlocked check-then-insert into
//! a process-wide table, which failed one of two concurrent sessions ("the domain is
//! already exist") until `provider::session_builder` registered it once under a lock.

use std::sync::Barrier;

use exporter::export::ExportOptions;
use exporter::model::NeedleModel;
use graphs::contract::{AttentionKind, MatMulWeights, Precision, RuntimeTarget, Variant};
use runner::provider::{session_builder, Provider};
use runner::session::NeedleSession;
use test_support::fixture;

const THREADS: usize = 8;

#[test]
fn first_sessions_on_many_threads_all_load() {
    let model = NeedleModel::read(&fixture("m64.cact")).unwrap();
    let onnx = model.export(&ExportOptions::in_memory(Variant {
        attention: AttentionKind::FUSED,
        precision: Precision::Fp32,
        matmul_weights: MatMulWeights::Packed,
        runtime: RuntimeTarget::Since1_24,
    }));
    let environment = runner::ort_env::init().unwrap();
    let start = Barrier::new(THREADS);
    std::thread::scope(|s| {
        let sessions: Vec<_> = (0..THREADS)
            .map(|_| {
                s.spawn(|| -> anyhow::Result<()> {
                    start.wait();
                    let registered = session_builder(environment, Provider::Cpu, false, 1)?;
                    NeedleSession::from_memory(&onnx, registered).map(drop)
                })
            })
            .collect();
        for (i, session) in sessions.into_iter().enumerate() {
            let loaded = session.join().unwrap();
            assert!(loaded.is_ok(), "thread {i}: {:#}", loaded.unwrap_err());
        }
    });
}

//! Memory-budget sizing on the CPU against a budget that binds. In the `memory` test binary,
//! alone: the probe reads the process RSS, and other tests running in the same process (cargo
//! runs the tests of one binary in parallel threads) would be measured with it.

use candle_core::Device;
use yolo9::internals::memory::MemoryProbe;
use yolo9::internals::train::budget::{plan, BudgetRequest};

#[test]
fn a_binding_cpu_budget_picks_the_largest_micro_batch_that_fits() {
    let _alone = crate::alone();
    // The real model at --img 160 on the CPU: measure 1, 2, 4 with room to spare, then set the
    // budget's limit 40% of the way from the peak of 2 images to that of 4 (below 3 images).
    let probe = MemoryProbe::new(&Device::Cpu).unwrap();
    let req = |budget: u64| BudgetRequest {
        nc: 3,
        img: 160,
        targets_per_image: 40,
        max_batch: 4,
        budget,
        seed: 0,
        amp: false,
        arch: yolo9::model::weights::default_arch(yolo9::Graph::Train),
        graphs: false,
        fixed_batch: true,
    };
    let wide = plan(&req(64 << 30), &Device::Cpu, &probe).unwrap();
    let peak = |b: usize| wide.points.iter().find(|p| p.batch == b).unwrap().peak;
    eprintln!("measured: {:?}", wide.points);
    assert!(peak(1) < peak(2) && peak(2) < peak(4), "{:?}", wide.points);
    let limit = peak(2) as f64 + 0.4 * (peak(4) - peak(2)) as f64;
    let budget = (limit / (1.0 - yolo9::internals::budget::MARGIN)) as u64;
    let d = plan(&req(budget), &Device::Cpu, &probe).unwrap();
    eprintln!("{}", d.describe());
    let limit = budget as f64 * (1.0 - yolo9::internals::budget::MARGIN);
    assert_eq!(d.micro, 2, "{d:?}");
    assert!(d.measured as f64 <= limit, "{d:?}");
    // The next size up is predicted (and for 4, measured) above the limit.
    assert!(d.fit.predict(d.micro + 1) > limit, "{d:?}");
}

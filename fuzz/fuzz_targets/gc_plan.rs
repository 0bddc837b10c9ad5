//! GC plan decoding must never panic, whatever the bytes; a plan that decodes
//! encodes back to the same bytes.
#![no_main]
use larder_store::GcPlan;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(plan) = GcPlan::decode(data, "0000000000000002") {
        assert_eq!(plan.encode(), data);
    }
});

//! Every kernel compiles with NVRTC, for the architectures the backend targets. Needs
//! libnvrtc only, no GPU: point LD_LIBRARY_PATH at its directory, e.g. the
//! `nvidia/cuda_nvrtc/lib` of the `nvidia-cuda-nvrtc-cu12` wheel (docs/design/gpu.md).
//! Without it the test says so on stderr and passes, unless LARDER_REQUIRE_NVRTC=1,
//! which makes a missing NVRTC a failure (for the machines that are meant to have it).

use larder_gpu::kernels::ALL_KERNELS;

#[test]
fn every_kernel_compiles_to_ptx() {
    if !larder_gpu::nvrtc_available() {
        let required = std::env::var("LARDER_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
        assert!(
            !required,
            "LARDER_REQUIRE_NVRTC=1 but libnvrtc cannot be loaded"
        );
        eprintln!(
            "SKIPPED every_kernel_compiles_to_ptx: libnvrtc.so.12 cannot be loaded \
             (set LD_LIBRARY_PATH to the directory holding it)"
        );
        return;
    }
    // Hopper (H100, H200), Ampere, and NVRTC's default.
    for arch in [Some("compute_90"), Some("compute_80"), None] {
        let ptx = larder_gpu::compile_kernels(arch)
            .unwrap_or_else(|e| panic!("kernels for {arch:?}: {e}"))
            .to_src();
        if let Some(arch) = arch {
            let target = format!(".target {}", arch.replace("compute", "sm"));
            assert!(ptx.contains(&target), "PTX for {arch} lacks {target}");
        }
        for kernel in ALL_KERNELS {
            assert!(
                ptx.contains(&format!(".entry {kernel}(")),
                "PTX for {arch:?} lacks the entry point {kernel}"
            );
        }
        eprintln!(
            "compiled {} kernels for {arch:?}: {} bytes of PTX",
            ALL_KERNELS.len(),
            ptx.len()
        );
    }
}

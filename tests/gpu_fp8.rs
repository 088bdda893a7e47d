//! Host/device FP8 agreement: the host codec that quantizes the inputs must match the
//! device's E4M3 conversion bit for bit, and the kernel's decoder must match the host decode.

mod common;

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaModule, CudaStream, LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use rand::{Rng, SeedableRng};
use sdpa_runner::backend::cuda::{device, headers, nvrtc};
use sdpa_runner::fp8;

struct Codec {
    _ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    module: Arc<CudaModule>,
}

fn codec() -> Codec {
    let (ctx, info, _) = device::open(0).unwrap();
    let include = headers::find_in_environment().unwrap();
    let cuda = common::project_root().join("cuda");
    let source = std::fs::read_to_string(cuda.join("fp8_codec_check.cu")).unwrap();
    let options = nvrtc::build_options(&info.arch(), &[&include, &cuda], &[]);
    let compiled =
        nvrtc::compile(&source, "fp8_codec_check.cu", &options).unwrap_or_else(|e| panic!("{e}"));
    let module = ctx.load_module(Ptx::from_binary(compiled.cubin)).unwrap();
    Codec {
        stream: ctx.default_stream(),
        _ctx: ctx,
        module,
    }
}

fn is_f16_nan(bits: u16) -> bool {
    bits & 0x7C00 == 0x7C00 && bits & 0x03FF != 0
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_kernels_decoder_matches_the_host_decode_for_all_256_codes() {
    let c = codec();
    let f = c.module.load_function("fp8_decode_all").unwrap();
    let mut out = c.stream.alloc_zeros::<u16>(256).unwrap();
    let mut args = c.stream.launch_builder(&f);
    args.arg(&mut out);
    unsafe {
        args.launch(LaunchConfig {
            grid_dim: (1, 1, 1),
            block_dim: (64, 1, 1),
            shared_mem_bytes: 0,
        })
    }
    .unwrap();
    let device = c.stream.clone_dtoh(&out).unwrap();
    for code in 0..=255u8 {
        let host = fp8::decode_f16(code).to_bits();
        let dev = device[code as usize];
        if is_f16_nan(host) {
            assert!(
                is_f16_nan(dev),
                "code {code:#04x}: host NaN, device {dev:#06x}"
            );
        } else {
            assert_eq!(dev, host, "code {code:#04x}");
        }
    }
}

/// Ties between every pair of neighbouring codes and one f32 ulp either side, both signs,
/// saturation and underflow boundaries, zeros, infinities and subnormals.
fn edge_values() -> Vec<f32> {
    let mut v = vec![
        0.0,
        -0.0,
        448.0,
        -448.0,
        449.0,
        463.99,
        464.0,
        464.01,
        480.0,
        1e10,
        -1e10,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        f32::MIN_POSITIVE,
        1e-40,
        -1e-40,
        1e-30,
    ];
    let finite: Vec<f32> = (0..0x7Eu8).map(fp8::decode).collect();
    for w in finite.windows(2) {
        let mid = (w[0] + w[1]) / 2.0;
        for x in [
            w[0],
            mid,
            f32::from_bits(mid.to_bits() - 1),
            f32::from_bits(mid.to_bits() + 1),
        ] {
            v.push(x);
            v.push(-x);
        }
    }
    v
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn device_encode_matches_the_host_encode_bit_for_bit() {
    let mut inputs = edge_values();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    // Every exponent range, NaN payloads included, then the range the quantizer really feeds.
    inputs.extend((0..1_000_000).map(|_| f32::from_bits(rng.random::<u32>())));
    inputs.extend((0..1_000_000).map(|_| rng.random_range(-470.0f32..470.0)));
    inputs.extend((0..200_000).map(|_| rng.random_range(-0.02f32..0.02)));
    let c = codec();
    let f = c.module.load_function("fp8_encode").unwrap();
    let d_in = c.stream.clone_htod(&inputs).unwrap();
    let mut d_out = c.stream.alloc_zeros::<u8>(inputs.len()).unwrap();
    let n = inputs.len() as i32;
    let mut args = c.stream.launch_builder(&f);
    args.arg(&d_in).arg(&mut d_out).arg(&n);
    unsafe { args.launch(LaunchConfig::for_num_elems(inputs.len() as u32)) }.unwrap();
    let device = c.stream.clone_dtoh(&d_out).unwrap();
    let mut mismatches = Vec::new();
    for (&x, &dev) in inputs.iter().zip(&device) {
        let host = fp8::encode(x);
        let agree = if x.is_nan() {
            host & 0x7F == 0x7F && dev & 0x7F == 0x7F
        } else {
            host == dev
        };
        if !agree {
            mismatches.push(format!(
                "{x:e} ({:#010x}): host {host:#04x} device {dev:#04x}",
                x.to_bits()
            ));
        }
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} differ, e.g. {:?}",
        mismatches.len(),
        inputs.len(),
        &mismatches[..mismatches.len().min(10)]
    );
}

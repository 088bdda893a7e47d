//! `sdpa-runner kernels`: the kernels of cuda/kernels.toml, what each runs and how it is proven.

use super::Project;
use crate::cli::KernelsArgs;
use crate::error::{AppError, Outcome};
use crate::kernels::{Abi, MANIFEST_FILE, Manifest, PPrecision, Runner, Tiles};

pub fn list(args: &KernelsArgs) -> Result<Outcome, AppError> {
    let project = Project::load(&args.project)?;
    let manifest = Manifest::load(&project.root.cuda_dir().join(MANIFEST_FILE))?;
    crate::outln!("kernels in {}:", manifest.path.display());
    for k in &manifest.kernels {
        let default = if k.name == manifest.default {
            " (default)"
        } else {
            ""
        };
        let v = &k.variants;
        let supports = &k.supports;
        let yes = |b: bool| if b { "yes" } else { "no" };
        crate::outln!("{}{default}: {}", k.name, k.description);
        crate::outln!(
            "  source      cuda/{}, entries {}_d<D>[_causal], {}",
            k.source,
            k.entry,
            match k.arch.as_str() {
                "native" => "built for the GPU's own architecture".to_string(),
                a => format!("built for {a}"),
            }
        );
        crate::outln!(
            "  variants    {} ({}={}) vs {} ({}={}); proven by {}{}",
            v.baseline.name,
            v.define,
            v.baseline.value,
            v.candidate.name,
            v.define,
            v.candidate.value,
            v.proof_constant,
            v.proof_instruction
                .as_ref()
                .map_or(String::new(), |i| format!(
                    " and `{i}` in the candidate's PTX only"
                ))
        );
        crate::outln!(
            "  supports    D {:?}, causal {}, GQA/MQA {}, S_q != S_k {}",
            supports.head_dims,
            yes(supports.causal),
            yes(supports.gqa),
            yes(supports.sq_ne_sk)
        );
        crate::outln!(
            "  tiles       {} query rows per CTA, {} keys per KV tile; P in {} before P·V; Q, K, V {}",
            query_rows(&k.tiles),
            k.tiles.block_n,
            match k.numerics.p_precision {
                PPrecision::F16 => "f16",
                PPrecision::E4m3 => "e4m3",
            },
            match k.abi {
                Abi::Pointers => "as pointers",
                Abi::TensorMaps => "as TMA tensor maps",
                Abi::PointersAndKvMaps => "as pointers, K and V also as TMA tensor maps",
            }
        );
        crate::outln!("  PTX holds   {}", k.ptx_must_hold.join(", "));
        match k.runner {
            Runner::Checked => crate::outln!("  checked by  the runner (--kernel {})", k.name),
            Runner::Probe => crate::outln!(
                "  checked by  its probe only: `{}` (the runner refuses it until its numerics are modelled)",
                k.probe.as_deref().unwrap_or("?")
            ),
        }
    }
    Ok(Outcome::Pass)
}

/// A kernel's query rows per CTA as `kernels` prints them: D 128's beside where they differ,
/// and each head dim's narrower tile.
fn query_rows(tiles: &Tiles) -> String {
    let Some(m) = tiles.block_m else {
        return "SDPA_BLOCK_M (a define chooses it)".to_string();
    };
    let mut notes: Vec<String> = tiles
        .block_m_d128
        .filter(|&m128| m128 != m)
        .map(|m128| format!("D 128: {m128}"))
        .into_iter()
        .collect();
    notes.extend([64, 128].into_iter().filter_map(|d| {
        tiles
            .narrow(d)
            .map(|n| format!("D {d} also {} where its CTAs end sooner", n.rows))
    }));
    notes.extend([64, 128].into_iter().filter_map(|d| {
        tiles.mixed(d).map(|n| {
            format!(
                "D {d} unmasked also {} beside its own in one launch where its last wave ends sooner",
                n.rows
            )
        })
    }));
    if notes.is_empty() {
        m.to_string()
    } else {
        format!("{m} ({})", notes.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_rows_name_d128_where_it_differs_and_each_narrower_tile() {
        let tiles = |block_m, block_m_d128| Tiles {
            block_m,
            block_m_d128,
            block_n: 128,
            kv_split: 1,
            narrow_d64: None,
            narrow_d128: None,
            mixed_d64: None,
            mixed_d128: None,
        };
        assert_eq!(query_rows(&tiles(Some(128), None)), "128");
        assert_eq!(query_rows(&tiles(Some(128), Some(128))), "128");
        assert_eq!(query_rows(&tiles(Some(192), Some(128))), "192 (D 128: 128)");
        assert!(query_rows(&tiles(None, None)).starts_with("SDPA_BLOCK_M"));
        let narrow = Tiles {
            narrow_d64: Some(crate::kernels::NarrowTile {
                rows: 64,
                cta_time: 0.8,
            }),
            ..tiles(Some(192), Some(128))
        };
        assert_eq!(
            query_rows(&narrow),
            "192 (D 128: 128; D 64 also 64 where its CTAs end sooner)"
        );
        let mixed = Tiles {
            mixed_d64: Some(crate::kernels::NarrowTile {
                rows: 128,
                cta_time: 0.89,
            }),
            ..tiles(Some(192), None)
        };
        assert_eq!(
            query_rows(&mixed),
            "192 (D 64 unmasked also 128 beside its own in one launch where its last wave ends \
             sooner)"
        );
    }
}

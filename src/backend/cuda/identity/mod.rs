//! Variant identity: proof that a compiled module is the variant it claims to be, and its
//! resources. Read from the PTX (the `SDPA_*` constants the kernel publishes, whether any
//! `cp.async` instruction is present: ptx.rs), from ptxas's report, and at run time from the
//! driver; the launch geometry the constants give is geometry.rs's.

mod geometry;
mod ptx;

use serde::{Deserialize, Serialize};

pub use geometry::{KernelConstants, LaunchShape};
#[cfg(test)]
pub(in crate::backend::cuda) use geometry::{per_head_dim_constants, stage_d_constants};
pub use ptx::{
    PtxasReport, ptx_code, ptx_constant, ptx_constant_opt, ptx_has_cp_async, ptx_has_instruction,
};

use crate::schema::{KernelRef, VariantMeta};
use crate::shapes::Entry;
use crate::verdict::{Check, Verdict};

/// What proves that a module was built with the A/B switch it claims: the constant it
/// publishes equals the define's value, and the proof instruction (where the manifest names
/// one) is in the candidate's PTX and not in the baseline's. The defence against a "fast"
/// variant that was never actually built.
pub struct Toggle<'a> {
    pub define: &'a str,
    pub value: &'a str,
    pub constant: &'a str,
    pub instruction: Option<&'a str>,
    /// Whether this is the candidate's value (the proof instruction must be present).
    pub candidate: bool,
}

impl Toggle<'_> {
    /// Fails naming what did not take in `module` (e.g. "its d128 module") of variant `name`.
    pub fn check(&self, name: &str, module: &str, ptx: &str) -> Result<(), String> {
        let published = ptx_constant(ptx, self.constant)?;
        if self.value.parse::<u32>().ok() != Some(published) {
            return Err(format!(
                "variant {name}: asked for {}={}, but {module} publishes {}={published}: the \
                 switch did not take",
                self.define, self.value, self.constant
            ));
        }
        if let Some(instr) = self.instruction {
            let present = ptx_has_instruction(ptx, instr);
            if present != self.candidate {
                return Err(format!(
                    "variant {name}: asked for {}={}, but {module}'s PTX {} {instr} instructions, \
                     which cuda/kernels.toml says only the candidate's holds: the switch did not take",
                    self.define,
                    self.value,
                    if present { "has" } else { "has no" }
                ));
            }
        }
        Ok(())
    }
}

/// The KV split all `variants` (name, constants) share: one run checks them against one
/// emulation yardstick, so variants that sum in different orders cannot share a run.
pub fn shared_kv_split(variants: &[(&str, KernelConstants)]) -> Result<u32, String> {
    let first = variants.first().map_or(1, |(_, c)| c.kv_split);
    if variants.iter().all(|(_, c)| c.kv_split == first) {
        return Ok(first);
    }
    let listed: Vec<String> = variants
        .iter()
        .map(|(name, c)| format!("{name}: {}", c.kv_split))
        .collect();
    Err(format!(
        "the variants build different KV splits ({}), which sum in different orders and need \
         different emulation yardsticks; run each variant in its own run (--cp-async 0|1 with \
         its --define) and diff the runs with `sdpa-runner compare`",
        listed.join(", ")
    ))
}

/// What the driver reports for a loaded kernel at its launch configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DriverResources {
    pub registers_per_thread: u32,
    pub static_smem_bytes: u32,
    pub dynamic_smem_bytes: u32,
    /// Per-thread local memory: stack frame plus spills.
    pub local_bytes: u32,
    pub threads_per_block: u32,
    pub max_blocks_per_sm: u32,
}

/// One more entry of a variant (a module of its own): what identifies it and its resources.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EntryIdentity {
    pub entry: Entry,
    pub ptx_sha256: String,
    pub ptxas: PtxasReport,
    /// Absent when compiled without a GPU.
    pub driver: Option<DriverResources>,
}

/// A companion of one entry (a function of its own for a narrower query tile, in the entry's
/// module: [`KernelConstants::companion`]): its resources, gated like its entry's.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CompanionIdentity {
    pub entry: Entry,
    /// Its query rows (its name's `_m<rows>`).
    pub rows: u32,
    pub ptxas: PtxasReport,
    /// Absent when compiled without a GPU.
    pub driver: Option<DriverResources>,
}

/// Everything that identifies one compiled variant, as recorded in build_meta.json.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct VariantIdentity {
    pub name: String,
    pub defines: Vec<String>,
    pub ptx_sha256: String,
    pub cubin_sha256: String,
    pub ptx_has_cp_async: bool,
    pub constants: KernelConstants,
    /// ptxas's report of the base entry (D = 64, no mask: `Entry::BASE`).
    pub ptxas: PtxasReport,
    /// Absent when compiled without a GPU (`sdpa-runner build`). The base entry's.
    pub driver: Option<DriverResources>,
    /// The other entries the run built (D = 128, causal), each from a module of its own.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub entries: Vec<EntryIdentity>,
    /// The companions of the entries built, each from its entry's module.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub companions: Vec<CompanionIdentity>,
    /// The kernel source it was built from.
    pub kernel: KernelRef,
    /// Of the PTX without line information and comments ([`ptx_code`]): equal for two
    /// builds whose code is the same although a comment or a file name moved.
    pub ptx_code_sha256: String,
    /// What it compiled, by content (src/backend/cuda/code.rs): the same code wherever the
    /// files lie.
    pub code: crate::schema::CodeIdentity,
    /// Every function of its modules by its machine code (empty where a CUBIN could not be
    /// read: then no comparison can say two launches ran the same code).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub machine_code: Vec<crate::schema::FunctionCode>,
}

impl From<&VariantIdentity> for VariantMeta {
    fn from(id: &VariantIdentity) -> Self {
        VariantMeta {
            name: id.name.clone(),
            defines: id.defines.clone(),
            ptx_sha256: Some(id.ptx_sha256.clone()),
            ptx_has_cp_async: Some(id.ptx_has_cp_async),
            registers: id.registers(),
            smem_bytes: Some(id.smem_bytes()),
            spill_bytes: id.ptxas.spill_bytes(),
            blocks_per_sm: id.driver.as_ref().map(|d| d.max_blocks_per_sm),
            kernel: Some(id.kernel.clone()),
            ptx_code_sha256: Some(id.ptx_code_sha256.clone()),
            code: Some(id.code.clone()),
            machine_code: id.machine_code.clone(),
        }
    }
}

impl VariantIdentity {
    /// Registers, shared memory and spills from the driver where present, else from ptxas
    /// (the base entry's: the one reports show beside the variant).
    pub fn registers(&self) -> Option<u32> {
        self.entry(Entry::BASE).and_then(|e| e.registers())
    }

    pub fn smem_bytes(&self) -> u32 {
        self.entry(Entry::BASE)
            .map_or(self.constants.smem_bytes, |e| e.smem_bytes())
    }

    /// The facts of entry `e`, where it was built.
    pub fn entry(&self, e: Entry) -> Option<EntryFacts<'_>> {
        let smem_bytes = if e.d == 128 {
            self.constants.smem_bytes_d128
        } else {
            self.constants.smem_bytes
        };
        if e == Entry::BASE {
            return Some(EntryFacts {
                entry: e,
                smem_bytes,
                ptxas: &self.ptxas,
                driver: self.driver.as_ref(),
            });
        }
        self.entries
            .iter()
            .find(|x| x.entry == e)
            .map(|x| EntryFacts {
                entry: e,
                smem_bytes,
                ptxas: &x.ptxas,
                driver: x.driver.as_ref(),
            })
    }

    /// The resource gates of every function built: the base entry's under `resources.*` against
    /// `gates.resources`, each other entry's under `resources.<entry>.*` (e.g.
    /// `resources.d128_causal.regs_per_thread`) against its own limits, and each companion's
    /// under `resources.<entry>_m<rows>.*` against its entry's; blocks per SM is checked only
    /// when the driver reported it.
    pub fn resource_verdict(&self, all: &crate::gates::Gates) -> Verdict {
        let mut v = Verdict::default();
        let gates_of = |e: Entry| {
            if e == Entry::BASE {
                &all.resources
            } else {
                &all.resources_by_entry[&e.suffix()]
            }
        };
        let built = std::iter::once(Entry::BASE).chain(self.entries.iter().map(|x| x.entry));
        let entries = built.filter_map(|e| self.entry(e)).map(|e| {
            let prefix = if e.entry == Entry::BASE {
                "resources".to_string()
            } else {
                format!("resources.{}", e.entry.suffix())
            };
            (prefix, e)
        });
        let companions = self.companions.iter().filter_map(|x| {
            let facts = self.entry(x.entry)?;
            Some((
                format!("resources.{}_m{}", x.entry.suffix(), x.rows),
                EntryFacts {
                    ptxas: &x.ptxas,
                    driver: x.driver.as_ref(),
                    ..facts
                },
            ))
        });
        for (prefix, e) in entries.chain(companions) {
            let gates = gates_of(e.entry);
            if let Some(regs) = e.registers() {
                v.add(
                    &format!("{prefix}.regs_per_thread"),
                    Check::at_most(regs as f64, gates.max_regs_per_thread as f64),
                );
            }
            v.add(
                &format!("{prefix}.smem_bytes"),
                Check::at_most(e.smem_bytes() as f64, gates.max_smem_bytes as f64),
            );
            let spills = e.ptxas.spill_bytes().or(e.driver.map(|d| d.local_bytes));
            if let Some(spills) = spills {
                v.add(
                    &format!("{prefix}.spill_bytes"),
                    Check::at_most(spills as f64, gates.max_spill_bytes as f64),
                );
            }
            if let Some(d) = e.driver {
                v.add(
                    &format!("{prefix}.blocks_per_sm"),
                    Check::at_least(d.max_blocks_per_sm as f64, gates.min_blocks_per_sm as f64),
                );
            }
        }
        v
    }
}

/// One entry of a variant as its resource gates read it.
pub struct EntryFacts<'a> {
    pub entry: Entry,
    smem_bytes: u32,
    ptxas: &'a PtxasReport,
    driver: Option<&'a DriverResources>,
}

impl EntryFacts<'_> {
    pub fn registers(&self) -> Option<u32> {
        self.driver
            .map(|d| d.registers_per_thread)
            .or(self.ptxas.registers)
    }

    pub fn smem_bytes(&self) -> u32 {
        self.driver.map_or(self.smem_bytes, |d| {
            d.static_smem_bytes + d.dynamic_smem_bytes
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gates::ResourceGates;

    #[test]
    fn variants_that_split_the_keys_differently_cannot_share_a_run() {
        let with_split = |kv_split| KernelConstants {
            kv_split,
            ..identity(false, 0).constants
        };
        assert_eq!(
            shared_kv_split(&[("cp0", with_split(2)), ("cp1", with_split(2))]),
            Ok(2)
        );
        let err = shared_kv_split(&[("cp0", with_split(2)), ("cp0+", with_split(1))]).unwrap_err();
        assert!(
            err.contains("(cp0: 2, cp0+: 1)") && err.contains("sdpa-runner compare"),
            "{err}"
        );
    }

    fn identity(cp: bool, published: u32) -> VariantIdentity {
        // The module's and its one entry's ptxas figures: 96 registers, no stack, no spill.
        let clean = PtxasReport {
            registers: Some(96),
            stack_frame_bytes: Some(0),
            spill_store_bytes: Some(0),
            spill_load_bytes: Some(0),
        };
        VariantIdentity {
            name: "cp1".into(),
            defines: vec![],
            ptx_sha256: String::new(),
            cubin_sha256: String::new(),
            ptx_has_cp_async: cp,
            constants: KernelConstants {
                block_m: 64,
                block_n: 64,
                kv_split: 2,
                threads: 128,
                block_m_d128: 0,
                threads_d128: 0,
                narrow_rows: 0,
                narrow_rows_d128: 0,
                companion_rows: 0,
                companion_threads: 0,
                companion_rows_d128: 0,
                companion_threads_d128: 0,
                smem_bytes: 61440,
                smem_bytes_d128: 61440,
                short_q_rows: 0,
                smem_bytes_d128_short: 0,
                pack_heads_8: 1,
                pack_heads_16: 1,
                split_kv_ctas: 0,
                split_kv_ctas_8: 0,
                split_kv_max: 0,
                switch: published,
                v_swizzle: false,
                causal_heads_first: false,
                mixed_unit_rows: 0,
                rescale_threshold: 0,
                row_sum_mma: None,
            },
            ptxas: clean.clone(),
            driver: None,
            entries: vec![EntryIdentity {
                entry: Entry {
                    d: 128,
                    causal: true,
                },
                ptx_sha256: String::new(),
                ptxas: clean,
                driver: None,
            }],
            companions: vec![],
            kernel: KernelRef {
                role: Default::default(),
                source: "k.cu".into(),
                sha256: String::new(),
            },
            ptx_code_sha256: String::new(),
            code: crate::schema::CodeIdentity {
                sha256: String::new(),
                files: Vec::new(),
                defines: Vec::new(),
                options: Vec::new(),
            },
            machine_code: Vec::new(),
        }
    }

    #[test]
    fn a_switch_that_did_not_take_is_caught_by_its_constant_or_its_instruction() {
        let module = |published: u32, cp: bool| {
            format!(
                ".const .align 4 .u32 SDPA_USE_CP_ASYNC = {published};\n{}",
                if cp {
                    "\tcp.async.ca.shared.global [%r1], [%rd1], 16;\n"
                } else {
                    ""
                }
            )
        };
        let cp = |value: &'static str, candidate| Toggle {
            define: "USE_CP_ASYNC",
            value,
            constant: "SDPA_USE_CP_ASYNC",
            instruction: Some("cp.async"),
            candidate,
        };
        assert!(cp("1", true).check("cp1", "m", &module(1, true)).is_ok());
        assert!(cp("0", false).check("cp0", "m", &module(0, false)).is_ok());
        let err = cp("1", true)
            .check("cp1", "m", &module(0, true))
            .unwrap_err();
        assert!(
            err.contains("SDPA_USE_CP_ASYNC=0") && err.contains("did not take"),
            "{err}"
        );
        let err = cp("1", true)
            .check("cp1", "m", &module(1, false))
            .unwrap_err();
        assert!(err.contains("has no cp.async"), "{err}");
        assert!(cp("0", false).check("cp0", "m", &module(0, true)).is_err());
        // A switch proven by its constant alone (Stage D's pipeline depth).
        let stages = Toggle {
            define: "KV_STAGES",
            value: "3",
            constant: "SDPA_KV_STAGES",
            instruction: None,
            candidate: true,
        };
        let st = |n: u32| format!(".const .align 4 .u32 SDPA_KV_STAGES = {n};\n");
        assert!(stages.check("st3", "m", &st(3)).is_ok());
        assert!(stages.check("st3", "m", &st(2)).is_err());
    }

    #[test]
    fn resource_gates_apply_to_registers_smem_spills_and_occupancy() {
        let gates = ResourceGates {
            max_regs_per_thread: 128,
            max_smem_bytes: 65536,
            max_spill_bytes: 0,
            min_blocks_per_sm: 2,
        };
        let mut all = crate::gates::GateFile::parse(
            std::path::Path::new("gates/default.json"),
            include_str!("../../../../gates/default.json"),
        )
        .unwrap()
        .gates;
        all.resources = gates.clone();
        all.resources_by_entry
            .get_mut("d128_causal")
            .unwrap()
            .max_regs_per_thread = 255;
        let mut id = identity(true, 1);
        assert!(id.resource_verdict(&all).pass());
        assert_eq!(
            id.resource_verdict(&all).checks.len(),
            6,
            "three per entry, no occupancy without a driver"
        );
        id.entries[0].ptxas.registers = Some(200);
        assert!(
            id.resource_verdict(&all).pass(),
            "D = 128 has its own limit"
        );
        id.entries[0].ptxas.registers = Some(256);
        assert_eq!(
            id.resource_verdict(&all).failures(),
            ["resources.d128_causal.regs_per_thread 256 > 255"]
        );
        id.entries[0].ptxas.registers = Some(96);
        id.driver = Some(DriverResources {
            registers_per_thread: 96,
            static_smem_bytes: 0,
            dynamic_smem_bytes: 61440,
            local_bytes: 0,
            threads_per_block: 128,
            max_blocks_per_sm: 1,
        });
        assert_eq!(
            id.resource_verdict(&all).failures(),
            ["resources.blocks_per_sm 1 < 2"]
        );
        id.ptxas.spill_store_bytes = Some(8);
        assert!(!id.resource_verdict(&all).checks["resources.spill_bytes"].pass);
    }

    #[test]
    fn a_companion_is_gated_by_its_entrys_limits_under_its_own_name() {
        let mut all = crate::gates::GateFile::parse(
            std::path::Path::new("gates/default.json"),
            include_str!("../../../../gates/default.json"),
        )
        .unwrap()
        .gates;
        all.resources_by_entry
            .get_mut("d128_causal")
            .unwrap()
            .max_regs_per_thread = 168;
        let mut id = identity(true, 1);
        let d128c = id.entries[0].entry;
        id.companions.push(CompanionIdentity {
            entry: d128c,
            rows: 128,
            ptxas: PtxasReport {
                registers: Some(168),
                stack_frame_bytes: Some(0),
                spill_store_bytes: Some(0),
                spill_load_bytes: Some(0),
            },
            driver: None,
        });
        let v = id.resource_verdict(&all);
        assert!(v.pass(), "{:?}", v.failures());
        assert_eq!(v.checks.len(), 9, "three per function");
        id.companions[0].ptxas.registers = Some(176);
        id.companions[0].ptxas.spill_load_bytes = Some(4);
        assert_eq!(
            id.resource_verdict(&all).failures(),
            [
                "resources.d128_causal_m128.regs_per_thread 176 > 168",
                "resources.d128_causal_m128.spill_bytes 4 > 0"
            ]
        );
    }
}

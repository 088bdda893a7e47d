//! Machine code function by function: a CUBIN read into its kernels' code, and two builds
//! compared kernel by kernel (`sdpa-runner build --base-kernel`, docs/DESIGN.md "Kernel
//! sources"). A change to one function of a kernel can move the code of others (ptxas assigns
//! registers per function, and a shared helper is inlined everywhere); this says which
//! functions it did move, so that where a problem's functions kept their code, a change of its
//! time can only come from the host or from noise.
//!
//! A function's code is, here: its instructions (the bytes of `.text.<name>`; in a whole-program
//! build, the runner's, a device function it calls lies there too), the relocations applied to
//! them (by symbol name), its `.nv.info` values (registers, stack sizes and the rest), its own
//! attributes (`.nv.info.<name>`), the sections that belong to it alone (`.nv.shared.<name>`,
//! `.nv.constant0.<name>`: their sizes and bytes), and, in a relocatable build, the code of every
//! function of the module it calls (a relocation naming it, in its own code or in a table the
//! module holds). What every function may read is the module's: every other section the GPU
//! loads (constant banks of global addresses and `__constant__` data, global variables,
//! reserved shared memory). The same instructions can address another global through the same
//! slot, and which function reads which slot is not known without decoding them, so where any
//! of those differ every function counts as differing (reason "the module's globals"): a false
//! "differs" is possible; a false "same" would take a difference the GPU does not load, or a
//! call to a function outside the module (which the runner's whole-program builds never make).

mod elf;

use std::collections::{BTreeMap, BTreeSet};

use elf::{Elf, Relocation, SHF_ALLOC, SHF_INFO_LINK};

/// `.nv.info` attributes named in the reasons a function differs.
const EIATTR_REGCOUNT: u8 = 0x2f;
const EIATTR_FRAME_SIZE: u8 = 0x11;
const EIATTR_MIN_STACK_SIZE: u8 = 0x12;
const EIATTR_CRS_STACK_SIZE: u8 = 0x1e;
const EIATTR_MAX_STACK_SIZE: u8 = 0x23;

/// One kernel (or, in a relocatable build, device function) of a module.
#[derive(Debug, Clone, PartialEq)]
pub struct Function {
    pub name: String,
    /// Bytes of instructions.
    pub code_bytes: usize,
    text: Vec<u8>,
    relocations: Vec<Relocation>,
    /// `.nv.info`'s values of this function's symbol: attribute -> value.
    info: BTreeMap<u8, u32>,
    /// `.nv.info.<name>`'s bytes and those of the other sections of this function alone, with
    /// their sizes (shared memory takes no bytes in the file).
    own: Vec<(String, usize, Vec<u8>)>,
}

/// A loaded section every function of the module may read: (name, size, bytes, relocations).
type Global = (String, usize, Vec<u8>, Vec<Relocation>);

/// A module's functions and what they share.
#[derive(Debug, Clone, PartialEq)]
pub struct Module {
    pub functions: Vec<Function>,
    globals: Vec<Global>,
}

/// How a function of the candidate's module compares with the base's of the same name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    Same,
    /// What differs, in words (at least one).
    Differs(Vec<&'static str>),
    OnlyInBase,
    OnlyInCandidate,
}

impl Change {
    pub fn is_same(&self) -> bool {
        *self == Change::Same
    }
}

/// One row of a comparison: the function's name, its code bytes in the candidate and in the
/// base (0 where it has none), and the change.
#[derive(Debug, Clone, PartialEq)]
pub struct Compared {
    pub name: String,
    pub bytes: usize,
    pub base_bytes: usize,
    pub change: Change,
}

/// Reads a CUBIN (a 64-bit little-endian ELF file, as NVRTC and ptxas write it).
pub fn parse(cubin: &[u8]) -> Result<Module, String> {
    let elf = Elf::read(cubin)?;
    let mut info = elf.symbol_attributes()?;
    let mut functions = Vec::new();
    let mut globals = Vec::new();
    for (i, s) in elf.sections.iter().enumerate() {
        if let Some(name) = s.name.strip_prefix(".text.") {
            let mut own = Vec::new();
            for part in [".nv.info.", ".nv.shared.", ".nv.constant0."] {
                if let Some(p) = elf.named(&format!("{part}{name}")) {
                    own.push((p.name.clone(), p.size, elf.body(p)?.to_vec()));
                }
            }
            functions.push(Function {
                name: name.to_string(),
                code_bytes: s.size,
                text: elf.body(s)?.to_vec(),
                relocations: elf.relocations_of(i)?,
                info: info.remove(name).unwrap_or_default(),
                own,
            });
        } else if s.flags & SHF_ALLOC != 0 && s.flags & SHF_INFO_LINK == 0 {
            globals.push((
                s.name.clone(),
                s.size,
                elf.body(s)?.to_vec(),
                elf.relocations_of(i)?,
            ));
        }
    }
    if functions.is_empty() {
        return Err("the module has no .text section of a function".into());
    }
    functions.sort_by(|a, b| a.name.cmp(&b.name));
    globals.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(Module { functions, globals })
}

/// Compares two modules function by function, in name order.
pub fn compare(base: &Module, candidate: &Module) -> Vec<Compared> {
    let globals_differ = base.globals != candidate.globals;
    let (b, c) = (by_name(base), by_name(candidate));
    let names: BTreeSet<&str> = b.keys().chain(c.keys()).copied().collect();
    let mut rows: Vec<Compared> = names
        .into_iter()
        .map(|name| {
            let (fb, fc) = (b.get(name), c.get(name));
            let change = match (fb, fc) {
                (Some(fb), Some(fc)) => {
                    let mut what = differences(fb, fc);
                    if globals_differ {
                        what.push("the module's globals");
                    }
                    if what.is_empty() {
                        Change::Same
                    } else {
                        Change::Differs(what)
                    }
                }
                (Some(_), None) => Change::OnlyInBase,
                _ => Change::OnlyInCandidate,
            };
            Compared {
                name: name.to_string(),
                bytes: fc.map_or(0, |f| f.code_bytes),
                base_bytes: fb.map_or(0, |f| f.code_bytes),
                change,
            }
        })
        .collect();
    // A function that calls one whose code differs runs other code too, transitively. A call
    // is a relocation naming the callee: in the caller's code, or, for a call through a table
    // of functions, in what the module holds (any function may read it).
    let through_tables: BTreeSet<&String> = candidate
        .globals
        .iter()
        .flat_map(|g| g.3.iter().map(|r| &r.symbol))
        .collect();
    loop {
        let differing: BTreeSet<String> = rows
            .iter()
            .filter(|r| !r.change.is_same())
            .map(|r| r.name.clone())
            .collect();
        let mut moved = false;
        for row in rows.iter_mut().filter(|r| r.change.is_same()) {
            let calls_one = c[row.name.as_str()]
                .relocations
                .iter()
                .map(|r| &r.symbol)
                .chain(through_tables.iter().copied())
                .any(|s| differing.contains(s));
            if calls_one {
                row.change = Change::Differs(vec!["a function it calls"]);
                moved = true;
            }
        }
        if !moved {
            return rows;
        }
    }
}

/// Each function's machine code as one hash (sha256, hex), in name order: equal for two
/// functions exactly where [`compare`] says `Same` of them. It covers what `compare` compares:
/// the function's instructions, relocations (by symbol name), `.nv.info` values and own
/// sections, the module's globals, and the same of every function of the module it calls,
/// transitively (through a table the module holds: every function it names). Results files
/// keep these hashes (`VariantMeta::machine_code`), so that two runs, or the two sides of an
/// A/B, can tell which problems ran the same code (src/perf/same_code.rs).
pub fn fingerprints(m: &Module) -> Vec<(String, String)> {
    use sha2::{Digest, Sha256};
    let functions = by_name(m);
    let through_tables: BTreeSet<&str> = m
        .globals
        .iter()
        .flat_map(|g| g.3.iter().map(|r| r.symbol.as_str()))
        .filter(|s| functions.contains_key(s))
        .collect();
    let mut globals = Sha256::new();
    for (name, size, bytes, relocations) in &m.globals {
        field(&mut globals, name.as_bytes());
        field(&mut globals, &size.to_le_bytes());
        field(&mut globals, bytes);
        field(&mut globals, &(relocations.len() as u64).to_le_bytes());
        for r in relocations {
            relocation(&mut globals, r);
        }
    }
    let globals = globals.finalize();
    m.functions
        .iter()
        .map(|f| {
            // The functions it may run: itself, those it calls and theirs, and those a table
            // names (any function may call through it).
            let mut reached: BTreeSet<&str> = BTreeSet::new();
            let mut todo: Vec<&str> = through_tables.iter().copied().collect();
            todo.push(f.name.as_str());
            while let Some(name) = todo.pop() {
                if reached.insert(name) {
                    todo.extend(
                        functions[name]
                            .relocations
                            .iter()
                            .map(|r| r.symbol.as_str())
                            .filter(|s| functions.contains_key(s)),
                    );
                }
            }
            let mut h = Sha256::new();
            field(&mut h, b"sdpa-runner machine code 1");
            field(&mut h, &globals);
            own_parts(&mut h, f);
            for name in reached.iter().filter(|n| **n != f.name) {
                own_parts(&mut h, functions[name]);
            }
            (f.name.clone(), crate::inputs::hex(&h.finalize()))
        })
        .collect()
}

/// One field of a hash, its length first, so that no two sequences of fields hash alike.
fn field(h: &mut sha2::Sha256, bytes: &[u8]) {
    use sha2::Digest;
    h.update((bytes.len() as u64).to_le_bytes());
    h.update(bytes);
}

fn relocation(h: &mut sha2::Sha256, r: &Relocation) {
    field(h, &r.offset.to_le_bytes());
    field(h, &r.kind.to_le_bytes());
    field(h, r.symbol.as_bytes());
    field(h, &r.addend.to_le_bytes());
}

/// A function's own parts: its name, instructions, relocations, `.nv.info` values and
/// sections.
fn own_parts(h: &mut sha2::Sha256, f: &Function) {
    field(h, f.name.as_bytes());
    field(h, &f.text);
    field(h, &(f.relocations.len() as u64).to_le_bytes());
    for r in &f.relocations {
        relocation(h, r);
    }
    field(h, &(f.info.len() as u64).to_le_bytes());
    for (k, v) in &f.info {
        field(h, &[*k]);
        field(h, &v.to_le_bytes());
    }
    field(h, &(f.own.len() as u64).to_le_bytes());
    for (name, size, bytes) in &f.own {
        field(h, name.as_bytes());
        field(h, &size.to_le_bytes());
        field(h, bytes);
    }
}

fn by_name(m: &Module) -> BTreeMap<&str, &Function> {
    m.functions.iter().map(|f| (f.name.as_str(), f)).collect()
}

/// What differs between two builds of one function, in words.
fn differences(base: &Function, cand: &Function) -> Vec<&'static str> {
    let info_of = |f: &Function, keys: &[u8]| -> Vec<Option<u32>> {
        keys.iter().map(|k| f.info.get(k).copied()).collect()
    };
    let stack = [
        EIATTR_FRAME_SIZE,
        EIATTR_MIN_STACK_SIZE,
        EIATTR_CRS_STACK_SIZE,
        EIATTR_MAX_STACK_SIZE,
    ];
    let other_info = |f: &Function| -> Vec<(u8, u32)> {
        f.info
            .iter()
            .filter(|(k, _)| **k != EIATTR_REGCOUNT && !stack.contains(k))
            .map(|(k, v)| (*k, *v))
            .collect()
    };
    [
        (base.text != cand.text, "instructions"),
        (base.relocations != cand.relocations, "relocations"),
        (
            info_of(base, &[EIATTR_REGCOUNT]) != info_of(cand, &[EIATTR_REGCOUNT]),
            "registers",
        ),
        (info_of(base, &stack) != info_of(cand, &stack), "stack"),
        (
            other_info(base) != other_info(cand) || base.own != cand.own,
            "attributes, shared memory or parameters",
        ),
    ]
    .into_iter()
    .filter_map(|(differs, what)| differs.then_some(what))
    .collect()
}

#[cfg(test)]
mod tests {
    use super::elf::tests::{body_of, header_of};
    use super::elf::{u32_at, u64_at};
    use super::*;

    // NVRTC 13.0 builds (sm_90) of testdata/machine_code_{a,b,c,d,e}.cu, whose comments say
    // how each was built and how it differs from a or d.
    const A: &[u8] = include_bytes!("testdata/machine_code_a.cubin");
    const B: &[u8] = include_bytes!("testdata/machine_code_b.cubin");
    const C: &[u8] = include_bytes!("testdata/machine_code_c.cubin");
    const D: &[u8] = include_bytes!("testdata/machine_code_d.cubin");
    const E: &[u8] = include_bytes!("testdata/machine_code_e.cubin");

    fn changes(base: &[u8], cand: &[u8]) -> Vec<(String, Change)> {
        compare(&parse(base).unwrap(), &parse(cand).unwrap())
            .into_iter()
            .map(|c| (c.name, c.change))
            .collect()
    }

    fn change_of(base: &[u8], cand: &[u8], name: &str) -> Change {
        changes(base, cand)
            .into_iter()
            .find(|(n, _)| n == name)
            .unwrap()
            .1
    }

    /// `cubin` with the 8 bytes at `at` replaced by `f` of their value.
    fn patched(cubin: &[u8], at: usize, f: impl Fn(u64) -> u64) -> Vec<u8> {
        let mut out = cubin.to_vec();
        let v = f(u64_at(cubin, at).unwrap());
        out[at..at + 8].copy_from_slice(&v.to_le_bytes());
        out
    }

    #[test]
    fn a_module_is_read_into_its_kernels_with_their_registers() {
        let m = parse(A).unwrap();
        let names: Vec<&str> = m.functions.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["changed_fn", "reloc_fn", "same_fn"]);
        for f in &m.functions {
            assert!(f.code_bytes > 0 && f.code_bytes % 16 == 0, "{f:?}");
            assert!(
                f.info.get(&EIATTR_REGCOUNT).is_some_and(|&r| r > 0),
                "{f:?}"
            );
            assert!(
                f.own.iter().any(|(n, ..)| n.starts_with(".nv.constant0.")),
                "{f:?}"
            );
        }
        let globals: Vec<&str> = m.globals.iter().map(|g| g.0.as_str()).collect();
        assert_eq!(
            globals,
            [".nv.constant4", ".nv.global", ".nv.shared.reserved.0"]
        );
    }

    #[test]
    fn a_build_compared_with_itself_is_the_same_code_everywhere() {
        assert!(changes(A, A).iter().all(|(_, c)| c.is_same()));
        assert!(changes(D, D).iter().all(|(_, c)| c.is_same()));
    }

    #[test]
    fn only_the_functions_whose_instructions_changed_are_said_to_differ() {
        assert_eq!(
            changes(A, B),
            [
                ("changed_fn".into(), Change::Differs(vec!["instructions"])),
                ("reloc_fn".into(), Change::Differs(vec!["instructions"])),
                ("same_fn".into(), Change::Same),
            ]
        );
    }

    #[test]
    fn the_same_instructions_addressing_another_global_are_not_the_same_code() {
        // c's reloc_fn stores to b_sink through the constant-bank slot where a's stores to
        // a_sink: the bytes of every section are a's; only the symbols' names tell them apart.
        let (a, c) = (parse(A).unwrap(), parse(C).unwrap());
        let text = |m: &Module| {
            m.functions
                .iter()
                .map(|f| f.text.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(text(&a), text(&c), "the fixture must keep the instructions");
        let all = changes(A, C);
        assert!(
            all.iter()
                .all(|(_, c)| *c == Change::Differs(vec!["the module's globals"])),
            "{all:?}"
        );
    }

    #[test]
    fn a_global_variable_of_another_size_makes_every_function_differ() {
        let bigger = patched(A, header_of(A, ".nv.global") + 0x20, |n| n + 8);
        assert!(
            changes(A, &bigger)
                .iter()
                .all(|(_, c)| *c == Change::Differs(vec!["the module's globals"]))
        );
    }

    #[test]
    fn another_register_count_is_named() {
        // .nv.info's first REGCOUNT entry (format 4, attribute 0x2f, size 8: symbol, value).
        let info = body_of(A, ".nv.info");
        let mut at = info;
        while A[at + 1] != EIATTR_REGCOUNT {
            at += 4 + usize::from(u16::from_le_bytes([A[at + 2], A[at + 3]]));
        }
        let symbol = u32_at(A, at + 4).unwrap() as usize;
        let more = patched(A, at + 4, |v| v + (1 << 32));
        let changed: Vec<(String, Change)> = changes(A, &more)
            .into_iter()
            .filter(|(_, c)| !c.is_same())
            .collect();
        assert_eq!(changed.len(), 1, "{changed:?} (symbol {symbol})");
        assert_eq!(changed[0].1, Change::Differs(vec!["registers"]));
    }

    #[test]
    fn another_relocation_addend_is_named() {
        let rela = body_of(D, ".rela.text.caller_fn");
        let moved = patched(D, rela + 16, |a| a + 16);
        assert_eq!(
            change_of(D, &moved, "caller_fn"),
            Change::Differs(vec!["relocations"])
        );
        assert_eq!(change_of(D, &moved, "helper"), Change::Same);
    }

    #[test]
    fn a_kernel_whose_callee_changed_differs_though_its_own_bytes_do_not() {
        // Relocatable builds: helper has its own .text section; caller_fn's bytes are d's.
        let (d, e) = (parse(D).unwrap(), parse(E).unwrap());
        let caller = |m: &Module| m.functions.iter().find(|f| f.name == "caller_fn").cloned();
        assert_eq!(
            caller(&d).map(|f| f.text),
            caller(&e).map(|f| f.text),
            "the fixture must keep the caller's instructions"
        );
        assert_eq!(
            changes(D, E),
            [
                (
                    "caller_fn".into(),
                    Change::Differs(vec!["a function it calls"])
                ),
                ("helper".into(), Change::Differs(vec!["instructions"])),
            ]
        );
    }

    /// A synthetic module: top calls mid, mid calls leaf (of instructions `leaf_text`);
    /// by_table reaches leaf only through the module's table (where `table`).
    fn chain_module(leaf_text: u8, table: bool) -> Module {
        let reloc = |symbol: &str| Relocation {
            offset: 0,
            kind: 0,
            symbol: symbol.into(),
            addend: 0,
        };
        let function = |name: &str, calls: &[&str], text: u8| Function {
            name: name.into(),
            code_bytes: 16,
            text: vec![text; 16],
            relocations: calls.iter().map(|c| reloc(c)).collect(),
            info: BTreeMap::new(),
            own: Vec::new(),
        };
        Module {
            functions: vec![
                function("by_table", &[], 1),
                function("leaf", &[], leaf_text),
                function("mid", &["leaf"], 3),
                function("top", &["mid"], 4),
                function("unrelated", &[], 5),
            ],
            globals: if table {
                vec![(".nv.constant3".into(), 8, vec![0; 8], vec![reloc("leaf")])]
            } else {
                Vec::new()
            },
        }
    }

    #[test]
    fn a_change_reaches_every_caller_up_a_chain_and_through_a_table() {
        let module = |leaf_text: u8| chain_module(leaf_text, true);
        let rows = compare(&module(2), &module(9));
        let of = |n: &str| rows.iter().find(|r| r.name == n).unwrap().change.clone();
        assert_eq!(of("leaf"), Change::Differs(vec!["instructions"]));
        for caller in ["mid", "top", "by_table", "unrelated"] {
            // Any function may read the table, so each may call leaf through it.
            assert_eq!(
                of(caller),
                Change::Differs(vec!["a function it calls"]),
                "{caller}"
            );
        }
        let without_table = |leaf_text: u8| chain_module(leaf_text, false);
        let rows = compare(&without_table(2), &without_table(9));
        let of = |n: &str| rows.iter().find(|r| r.name == n).unwrap().change.clone();
        assert_eq!(of("top"), Change::Differs(vec!["a function it calls"]));
        assert_eq!(of("unrelated"), Change::Same);
        assert_eq!(of("by_table"), Change::Same);
    }

    #[test]
    fn a_function_on_one_side_only_is_named_as_such() {
        let a = parse(A).unwrap();
        let mut fewer = a.clone();
        fewer.functions.retain(|f| f.name != "same_fn");
        let rows = compare(&a, &fewer);
        let row = rows.iter().find(|r| r.name == "same_fn").unwrap();
        assert_eq!(row.change, Change::OnlyInBase);
        assert_eq!(row.bytes, 0);
        assert!(row.base_bytes > 0);
        let rows = compare(&fewer, &a);
        assert_eq!(
            rows.iter().find(|r| r.name == "same_fn").unwrap().change,
            Change::OnlyInCandidate
        );
    }

    #[test]
    fn two_functions_hash_alike_exactly_where_compare_calls_them_the_same() {
        let regcount = {
            let mut at = body_of(A, ".nv.info");
            while A[at + 1] != EIATTR_REGCOUNT {
                at += 4 + usize::from(u16::from_le_bytes([A[at + 2], A[at + 3]]));
            }
            patched(A, at + 4, |v| v + (1 << 32))
        };
        let addend = patched(D, body_of(D, ".rela.text.caller_fn") + 16, |a| a + 16);
        let global = patched(A, header_of(A, ".nv.global") + 0x20, |n| n + 8);
        let read = |c: &[u8]| parse(c).unwrap();
        let mutated = |c: &[u8], name: &str, f: &dyn Fn(&mut Function)| {
            let mut m = read(c);
            f(m.functions.iter_mut().find(|f| f.name == name).unwrap());
            m
        };
        let mut pairs = vec![
            (read(A), read(A)),
            (read(A), read(B)),
            (read(A), read(C)),
            (read(A), read(&regcount)),
            (read(A), read(&global)),
            (read(D), read(D)),
            (read(D), read(E)),
            (read(D), read(&addend)),
            (chain_module(2, true), chain_module(9, true)),
            (chain_module(2, false), chain_module(9, false)),
            (chain_module(2, false), chain_module(2, false)),
        ];
        let changes: [&dyn Fn(&mut Function); 6] = [
            &|f| f.own[0].2.push(0),
            &|f| f.own[0].1 += 16,
            &|f| {
                f.info.insert(EIATTR_MAX_STACK_SIZE, 64);
            },
            &|f| {
                f.info.insert(0x99, 1);
            },
            &|f| f.relocations[0].offset += 8,
            &|f| f.relocations[0].kind += 1,
        ];
        for (i, change) in changes.into_iter().enumerate() {
            // D's caller_fn has relocations; A's changed_fn has none.
            pairs.push((read(D), mutated(D, "caller_fn", change)));
            if i < 4 {
                pairs.push((read(A), mutated(A, "changed_fn", change)));
            }
        }
        let (mut same, mut differ) = (0, 0);
        for (base, cand) in &pairs {
            let (fb, fc) = (fingerprints(base), fingerprints(cand));
            for row in compare(base, cand) {
                let hash = |f: &[(String, String)]| {
                    f.iter()
                        .find(|(n, _)| *n == row.name)
                        .map(|(_, h)| h.clone())
                };
                let (Some(hb), Some(hc)) = (hash(&fb), hash(&fc)) else {
                    continue;
                };
                assert_eq!(hb == hc, row.change.is_same(), "{row:?}");
                if row.change.is_same() {
                    same += 1;
                } else {
                    differ += 1;
                }
            }
        }
        assert!(same >= 10 && differ >= 20, "same {same}, differ {differ}");
        let hashes = fingerprints(&read(A));
        let distinct: BTreeSet<&String> = hashes.iter().map(|(_, h)| h).collect();
        assert_eq!(distinct.len(), hashes.len(), "each function hashes apart");
    }
}

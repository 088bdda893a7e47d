//! GPU clocks, temperature and power, read (never set) through `nvidia-smi` before and after
//! timing, so a report shows whether the card throttled while it was measured.

use std::process::Command;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClockReading {
    pub sm_mhz: Option<u32>,
    pub memory_mhz: Option<u32>,
    pub temperature_c: Option<u32>,
    pub power_w: Option<f64>,
    /// Where the numbers came from, or why there are none.
    pub source: String,
}

impl ClockReading {
    pub fn unknown(why: &str) -> Self {
        ClockReading {
            sm_mhz: None,
            memory_mhz: None,
            temperature_c: None,
            power_w: None,
            source: why.to_string(),
        }
    }

    /// "SM 1980 MHz, memory 3201 MHz, 41 C, 129 W", or why unknown.
    pub fn brief(&self) -> String {
        match (self.sm_mhz, self.memory_mhz) {
            (Some(sm), Some(mem)) => {
                let mut s = format!("SM {sm} MHz, memory {mem} MHz");
                if let Some(t) = self.temperature_c {
                    s.push_str(&format!(", {t} C"));
                }
                if let Some(p) = self.power_w {
                    s.push_str(&format!(", {p:.0} W"));
                }
                s
            }
            _ => format!("unknown ({})", self.source),
        }
    }
}

/// Reads the GPU of this UUID through nvidia-smi (which numbers GPUs by PCI bus, not as CUDA
/// does, so the UUID names it); unknown where nvidia-smi is missing or fails.
pub fn read_gpu(uuid: &str) -> ClockReading {
    let out = Command::new("nvidia-smi")
        .args([
            "--query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw",
            "--format=csv,noheader,nounits",
            "-i",
            uuid,
        ])
        .output();
    match out {
        Ok(o) if o.status.success() => parse(&String::from_utf8_lossy(&o.stdout)),
        Ok(o) => ClockReading::unknown(&format!(
            "nvidia-smi failed: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        )),
        Err(e) => ClockReading::unknown(&format!("nvidia-smi not available: {e}")),
    }
}

fn parse(line: &str) -> ClockReading {
    let fields: Vec<&str> = line.trim().split(',').map(str::trim).collect();
    let int = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .map(|v| v as u32)
    };
    ClockReading {
        sm_mhz: int(0),
        memory_mhz: int(1),
        temperature_c: int(2),
        power_w: fields.get(3).and_then(|f| f.parse().ok()),
        source: "nvidia-smi".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidia_smi_csv_is_parsed_and_missing_fields_stay_unknown() {
        let r = parse("1980, 3201, 41, 129.53\n");
        assert_eq!(
            (r.sm_mhz, r.memory_mhz, r.temperature_c),
            (Some(1980), Some(3201), Some(41))
        );
        assert_eq!(r.brief(), "SM 1980 MHz, memory 3201 MHz, 41 C, 130 W");
        let r = parse("1980, [N/A], [N/A], [N/A]");
        assert_eq!(
            (r.sm_mhz, r.memory_mhz, r.power_w),
            (Some(1980), None, None)
        );
        assert!(
            ClockReading::unknown("cpu backend")
                .brief()
                .contains("cpu backend")
        );
    }
}

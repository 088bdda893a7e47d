//! Errors in what the user asked for (flags, shape and gate files) and the small parsers
//! for command-line lists. Every [`ConfigError`] exits with code 2.

use std::path::PathBuf;

/// A usage or configuration mistake: the message names the cause and the fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A file parsed but a key is missing, unknown, of the wrong type or out of range.
    #[error("{path}: key `{key}`: {message}")]
    InvalidKey {
        path: PathBuf,
        key: String,
        message: String,
    },
    #[error(
        "unknown shape `{name}`; the shapes in {path} are: {known}. \
         Inline shapes are written BxHxSxD, for example 1x8x512x64"
    )]
    UnknownShape {
        name: String,
        path: PathBuf,
        known: String,
    },
    #[error("shape `{name}`: {message}")]
    BadShape { name: String, message: String },
    #[error(
        "shape `{name}` needs about {needed_gib:.1} GiB of {what}, but only {available_gib:.1} GiB \
         is available; choose a smaller B, H or S"
    )]
    TooLarge {
        name: String,
        what: String,
        needed_gib: f64,
        available_gib: f64,
    },
    #[error("{0}")]
    Usage(String),
}

impl ConfigError {
    pub fn invalid_key(
        path: &std::path::Path,
        key: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        ConfigError::InvalidKey {
            path: path.to_path_buf(),
            key: key.into(),
            message: message.into(),
        }
    }
}

/// Parses `--seeds`: a comma-separated list of integers and inclusive ranges (`0,1,2`, `0-4`).
/// Duplicates are dropped, order is kept.
pub fn parse_seeds(spec: &str) -> Result<Vec<u64>, String> {
    let mut seeds = Vec::new();
    for item in spec.split(',') {
        let item = item.trim();
        if item.is_empty() {
            return Err(format!(
                "`{spec}` has an empty item; write seeds as 0,1,2 or a range 0-4"
            ));
        }
        if item.starts_with("--") {
            return Err(format!(
                "`{item}` is a flag, not a seed list: give --seeds a value such as 0,1,2 or 0-4"
            ));
        }
        if item.starts_with('-') {
            return Err(format!(
                "`{item}` in `{spec}` is negative; seeds are non-negative integers, e.g. 0,1,2 or 0-4"
            ));
        }
        let (lo, hi) = match item.split_once('-') {
            Some((lo, hi)) => (parse_seed(lo, spec)?, parse_seed(hi, spec)?),
            None => {
                let s = parse_seed(item, spec)?;
                (s, s)
            }
        };
        if hi < lo {
            return Err(format!(
                "range `{item}` in `{spec}` runs backwards; write it as low-high"
            ));
        }
        if hi - lo >= 10_000 {
            return Err(format!("range `{item}` asks for more than 10000 seeds"));
        }
        for s in lo..=hi {
            if !seeds.contains(&s) {
                seeds.push(s);
            }
        }
    }
    Ok(seeds)
}

fn parse_seed(text: &str, spec: &str) -> Result<u64, String> {
    text.trim().parse::<u64>().map_err(|_| {
        format!(
            "`{text}` in `{spec}` is not a seed; seeds are non-negative integers, e.g. 0,1,2 or 0-4"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_accept_lists_and_ranges_and_drop_duplicates() {
        assert_eq!(parse_seeds("0,1,2").unwrap(), vec![0, 1, 2]);
        assert_eq!(parse_seeds("3-5, 1, 4").unwrap(), vec![3, 4, 5, 1]);
        assert_eq!(parse_seeds("7").unwrap(), vec![7]);
    }

    #[test]
    fn malformed_seeds_are_refused_with_the_offending_text() {
        // Each input is refused for its own reason, and the message says which.
        for (bad, why) in [
            ("", "has an empty item"),
            ("0,,1", "has an empty item"),
            ("a", "`a` in `a` is not a seed"),
            ("1.5", "`1.5` in `1.5` is not a seed"),
            (
                "-1",
                "`-1` in `-1` is negative; seeds are non-negative integers",
            ),
            ("5-3", "range `5-3` in `5-3` runs backwards"),
            ("0-99999", "range `0-99999` asks for more than 10000 seeds"),
            ("0,x", "`x` in `0,x` is not a seed"),
        ] {
            let err = parse_seeds(bad).unwrap_err();
            assert!(err.contains(why), "{bad:?}: {err}");
        }
    }
}

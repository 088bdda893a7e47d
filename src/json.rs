//! Strict JSON reading that names the file and the key at fault.

use std::path::Path;

use serde::de::DeserializeOwned;

use crate::usage::ConfigError;

/// Reads and deserializes the JSON file at `path`; errors name the file (and key).
pub fn read_file<T: DeserializeOwned>(path: &Path) -> Result<T, ConfigError> {
    from_str_with_path(path, &read_text(path)?)
}

/// The largest text file read (perf.json with every raw sample of a large run stays far below).
const MAX_TEXT_BYTES: u64 = 1 << 30;

/// Reads a file the user pointed at; the error names it. Only a regular file or a pipe
/// (`--gates <(...)`) is read, and at most 1 GiB of it: a device (`/dev/zero`) or a folder is
/// refused, not read forever.
pub fn read_text(path: &Path) -> Result<String, ConfigError> {
    use std::io::Read;
    let refuse = |source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    };
    let invalid =
        |why: &str| std::io::Error::new(std::io::ErrorKind::InvalidInput, why.to_string());
    let meta = std::fs::metadata(path).map_err(refuse)?;
    #[cfg(unix)]
    let pipe = std::os::unix::fs::FileTypeExt::is_fifo(&meta.file_type());
    #[cfg(not(unix))]
    let pipe = false;
    if !(meta.is_file() || pipe) {
        return Err(refuse(invalid("not a regular file or a pipe")));
    }
    let mut text = String::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(MAX_TEXT_BYTES + 1).read_to_string(&mut text))
        .map_err(refuse)?;
    if text.len() as u64 > MAX_TEXT_BYTES {
        return Err(refuse(invalid("larger than 1 GiB")));
    }
    Ok(text)
}

/// As [`read_text`], with `Ok(None)` when there is no file at `path`.
pub fn read_text_if_any(path: &Path) -> Result<Option<String>, ConfigError> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        _ => read_text(path).map(Some),
    }
}

/// As [`read_text_if_any`], for a file the runner finds by its name in a folder rather than one
/// the user pointed at (an export's manifest, an implementation's notes): only a regular file
/// is read; a pipe there would be waited on forever.
pub fn read_found_text_if_any(path: &Path) -> Result<Option<String>, ConfigError> {
    match std::fs::metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Ok(meta) if !meta.is_file() => Err(ConfigError::Read {
            path: path.to_path_buf(),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a regular file; write it as one",
            ),
        }),
        _ => read_text(path).map(Some),
    }
}

/// Deserializes `text`, which must hold one JSON value and nothing after it; on failure the
/// error names `path` and the dotted key path.
pub fn from_str_with_path<T: DeserializeOwned>(path: &Path, text: &str) -> Result<T, ConfigError> {
    let de = &mut serde_json::Deserializer::from_str(text);
    let value = deserialize(path, &mut *de)?;
    de.end().map_err(|inner| {
        ConfigError::invalid_key(path, "(file)", format!("malformed JSON: {inner}"))
    })?;
    Ok(value)
}

fn deserialize<T: DeserializeOwned>(
    path: &Path,
    de: &mut serde_json::Deserializer<serde_json::de::StrRead<'_>>,
) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(de).map_err(|err| {
        let inner = err.inner();
        if inner.is_syntax() || inner.is_eof() {
            return ConfigError::invalid_key(path, "(file)", format!("malformed JSON: {inner}"));
        }
        let key = err.path().to_string();
        let key = if key == "." {
            "(top level)".to_string()
        } else {
            key
        };
        ConfigError::invalid_key(path, key, inner.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Outer {
        inner: Inner,
    }
    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        x: f64,
    }

    #[cfg(unix)]
    #[test]
    fn a_found_file_must_be_regular_so_a_pipe_there_is_refused_not_waited_on() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("manifest.json");
        let made = std::process::Command::new("mkfifo").arg(&fifo).status();
        if !made.is_ok_and(|s| s.success()) {
            return; // no mkfifo on this machine
        }
        // Returns at once (a read would block: nothing writes the pipe).
        let err = read_found_text_if_any(&fifo).unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "{err}");
        assert_eq!(
            read_found_text_if_any(&dir.path().join("none.json")).unwrap(),
            None
        );
        let file = dir.path().join("f.json");
        std::fs::write(&file, "{}").unwrap();
        assert_eq!(
            read_found_text_if_any(&file).unwrap().as_deref(),
            Some("{}")
        );
    }

    #[test]
    fn errors_name_the_nested_key() {
        let err = from_str_with_path::<Outer>(Path::new("g.json"), r#"{"inner":{"x":"a"}}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("g.json") && err.contains("inner.x"), "{err}");
    }

    #[test]
    fn malformed_json_is_reported_as_such() {
        for text in [
            "{",
            r#"{"inner":{"x":1}} trailing"#,
            r#"{"inner":{"x":1}}{}"#,
        ] {
            let err = from_str_with_path::<Outer>(Path::new("g.json"), text)
                .unwrap_err()
                .to_string();
            assert!(err.contains("malformed JSON"), "{text}: {err}");
        }
        from_str_with_path::<Outer>(Path::new("g.json"), "{\"inner\":{\"x\":1}}\n").unwrap();
    }

    #[test]
    fn only_regular_files_and_pipes_are_read() {
        let dir = tempfile::tempdir().unwrap();
        let err = read_text(dir.path()).unwrap_err().to_string();
        assert!(err.contains("not a regular file"), "{err}");
        #[cfg(unix)]
        {
            let err = read_text(Path::new("/dev/zero")).unwrap_err().to_string();
            assert!(err.contains("not a regular file"), "{err}");
            // A pipe is read (`--gates <(...)`).
            let fifo = dir.path().join("fifo");
            let made = std::process::Command::new("mkfifo").arg(&fifo).status();
            if made.is_ok_and(|s| s.success()) {
                let writer = {
                    let fifo = fifo.clone();
                    std::thread::spawn(move || std::fs::write(fifo, "{}").unwrap())
                };
                assert_eq!(read_text(&fifo).unwrap(), "{}");
                writer.join().unwrap();
            }
        }
        assert!(
            read_text_if_any(&dir.path().join("none"))
                .unwrap()
                .is_none()
        );
        std::fs::write(dir.path().join("f"), "x").unwrap();
        assert_eq!(
            read_text_if_any(&dir.path().join("f")).unwrap().unwrap(),
            "x"
        );
    }
}

/// An f64 that may be infinite or NaN, written as a JSON number when finite and as the
/// string `"inf"`, `"-inf"` or `"nan"` otherwise (JSON has no such numbers: serde_json would
/// write `null` and refuse to read it back). An error ratio is infinite where a bound is 0:
/// a row that sees no key must be exactly zero (src/reference/bound.rs), and any other value
/// is infinitely far beyond its bound.
pub mod f64_or_inf {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(x: &f64, s: S) -> Result<S::Ok, S::Error> {
        match *x {
            x if x.is_finite() => s.serialize_f64(x),
            x if x.is_nan() => s.serialize_str("nan"),
            x if x > 0.0 => s.serialize_str("inf"),
            _ => s.serialize_str("-inf"),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Repr {
            Number(f64),
            Text(String),
        }
        match Repr::deserialize(d)? {
            Repr::Number(x) => Ok(x),
            Repr::Text(t) => match t.as_str() {
                "inf" => Ok(f64::INFINITY),
                "-inf" => Ok(f64::NEG_INFINITY),
                "nan" => Ok(f64::NAN),
                other => Err(serde::de::Error::custom(format!(
                    "`{other}` is not a number (nor inf, -inf, nan)"
                ))),
            },
        }
    }

    #[cfg(test)]
    mod tests {
        #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
        struct Ratio {
            #[serde(with = "super")]
            x: f64,
        }

        #[test]
        fn infinite_ratios_survive_a_round_trip_through_json() {
            for x in [f64::INFINITY, f64::NEG_INFINITY, 2.5, 0.0] {
                let text = serde_json::to_string(&Ratio { x }).unwrap();
                assert!(!text.contains("null"), "{text}");
                assert_eq!(serde_json::from_str::<Ratio>(&text).unwrap().x, x);
            }
            let nan = serde_json::to_string(&Ratio { x: f64::NAN }).unwrap();
            assert!(serde_json::from_str::<Ratio>(&nan).unwrap().x.is_nan());
            assert!(serde_json::from_str::<Ratio>(r#"{"x":"big"}"#).is_err());
        }
    }
}

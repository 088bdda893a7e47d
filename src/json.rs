//! Strict JSON reading that names the file and the key at fault.

use std::path::Path;

use serde::de::DeserializeOwned;

use crate::usage::ConfigError;

/// Reads and deserializes the JSON file at `path`; errors name the file (and key).
pub fn read_file<T: DeserializeOwned>(path: &Path) -> Result<T, ConfigError> {
    from_str_with_path(path, &read_text(path)?)
}

/// Reads a file the user pointed at; the error names it.
pub fn read_text(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// Deserializes `text`; on failure the error names `path` and the dotted key path.
pub fn from_str_with_path<T: DeserializeOwned>(path: &Path, text: &str) -> Result<T, ConfigError> {
    let de = &mut serde_json::Deserializer::from_str(text);
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

    #[test]
    fn errors_name_the_nested_key() {
        let err = from_str_with_path::<Outer>(Path::new("g.json"), r#"{"inner":{"x":"a"}}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("g.json") && err.contains("inner.x"), "{err}");
    }

    #[test]
    fn malformed_json_is_reported_as_such() {
        let err = from_str_with_path::<Outer>(Path::new("g.json"), "{")
            .unwrap_err()
            .to_string();
        assert!(err.contains("malformed JSON"), "{err}");
    }
}

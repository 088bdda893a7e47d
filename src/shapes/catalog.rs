//! The shapes file (shapes/default.json): its shapes, the by-name ones, the named sets, and
//! how a `--shapes` list of names, sets and inline shapes selects from them.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::Shape;
use crate::usage::ConfigError;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ShapeFile {
    version: u32,
    shapes: Vec<Shape>,
    /// Shapes run only when named: too heavy for `all` (long contexts, tens of GiB).
    #[serde(default)]
    by_name: Vec<Shape>,
    /// Named sets of shapes (e.g. `llm`), selected by their name like a shape.
    #[serde(default)]
    sets: std::collections::BTreeMap<String, Vec<String>>,
}

/// The shapes of one shapes file, validated.
#[derive(Debug, Clone)]
pub struct ShapeCatalog {
    path: PathBuf,
    /// `shapes`, then `by_name`.
    shapes: Vec<Shape>,
    /// How many of them `all` selects (the `shapes` list).
    in_all: usize,
    /// Named sets: each a list of the file's shape names.
    sets: std::collections::BTreeMap<String, Vec<String>>,
}

impl ShapeCatalog {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::parse(path, &crate::json::read_text(path)?)
    }

    pub fn parse(path: &Path, text: &str) -> Result<Self, ConfigError> {
        let file: ShapeFile = crate::json::from_str_with_path(path, text)?;
        if file.version != 1 {
            return Err(ConfigError::invalid_key(
                path,
                "version",
                format!(
                    "version {} is not supported; this runner reads version 1",
                    file.version
                ),
            ));
        }
        if file.shapes.is_empty() {
            return Err(ConfigError::invalid_key(
                path,
                "shapes",
                "the list is empty",
            ));
        }
        let in_all = file.shapes.len();
        let shapes: Vec<Shape> = file.shapes.into_iter().chain(file.by_name).collect();
        let key = |i: usize| {
            if i < in_all {
                format!("shapes[{i}]")
            } else {
                format!("by_name[{}]", i - in_all)
            }
        };
        for (i, shape) in shapes.iter().enumerate() {
            shape.validate().map_err(|m| {
                ConfigError::invalid_key(path, format!("{} ({})", key(i), shape.name), m)
            })?;
            if Shape::parse_inline(&shape.name).is_some() {
                return Err(ConfigError::invalid_key(
                    path,
                    format!("{}.name", key(i)),
                    format!(
                        "`{}` looks like an inline BxHxSxD shape; pick another name",
                        shape.name
                    ),
                ));
            }
            if shapes[..i].iter().any(|other| other.name == shape.name) {
                return Err(ConfigError::invalid_key(
                    path,
                    format!("{}.name", key(i)),
                    format!("`{}` is defined twice", shape.name),
                ));
            }
        }
        for (set, members) in &file.sets {
            let key = format!("sets.{set}");
            if members.is_empty() {
                return Err(ConfigError::invalid_key(path, key, "the set is empty"));
            }
            if set == "all" || shapes.iter().any(|s| &s.name == set) {
                return Err(ConfigError::invalid_key(
                    path,
                    key,
                    format!("`{set}` is already a shape's name (or `all`); pick another"),
                ));
            }
            if let Some(unknown) = members
                .iter()
                .find(|m| !shapes.iter().any(|s| &s.name == *m))
            {
                return Err(ConfigError::invalid_key(
                    path,
                    key,
                    format!("`{unknown}` is not a shape of this file"),
                ));
            }
        }
        Ok(ShapeCatalog {
            path: path.to_path_buf(),
            shapes,
            in_all,
            sets: file.sets,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every shape of the file, those `all` selects first.
    pub fn shapes(&self) -> &[Shape] {
        &self.shapes
    }

    /// Whether `all` selects this shape (false for the file's `by_name` list).
    pub fn in_all(&self, name: &str) -> bool {
        self.shapes[..self.in_all].iter().any(|s| s.name == name)
    }

    pub fn get(&self, name: &str) -> Option<&Shape> {
        self.shapes.iter().find(|s| s.name == name)
    }

    /// Resolves `--shapes`: comma-separated names of shapes or sets from this catalog, or
    /// inline `BxHxSxD[:options]` shapes; `all` selects every shape of the file's `shapes` list (not its `by_name` list).
    /// Duplicates are dropped.
    pub fn select(&self, spec: &str) -> Result<Vec<Shape>, ConfigError> {
        let mut selected: Vec<Shape> = Vec::new();
        for item in spec.split(',').map(str::trim) {
            if item.is_empty() {
                return Err(ConfigError::Usage(format!(
                    "--shapes `{spec}` has an empty item; write names separated by commas, e.g. small,mission"
                )));
            }
            let found: Vec<Shape> = if item == "all" {
                self.shapes[..self.in_all].to_vec()
            } else if let Some(members) = self.sets.get(item) {
                members
                    .iter()
                    .filter_map(|m| self.get(m).cloned())
                    .collect()
            } else if let Some(shape) = self.get(item) {
                vec![shape.clone()]
            } else if let Some(inline) = Shape::parse_inline(item) {
                vec![inline?]
            } else {
                return Err(ConfigError::UnknownShape {
                    name: item.into(),
                    path: self.path.clone(),
                    known: self.names().join(", "),
                });
            };
            for shape in found {
                if !selected.iter().any(|s| s.name == shape.name) {
                    selected.push(shape);
                }
            }
        }
        Ok(selected)
    }

    /// The file's shape names, then its set names.
    pub fn names(&self) -> Vec<&str> {
        self.shapes
            .iter()
            .map(|s| s.name.as_str())
            .chain(self.sets.keys().map(String::as_str))
            .collect()
    }

    /// The named sets and their shapes.
    pub fn sets(&self) -> &std::collections::BTreeMap<String, Vec<String>> {
        &self.sets
    }
}

#[cfg(test)]
pub(super) fn sample_catalog() -> ShapeCatalog {
    let text = r#"{"version":1,"shapes":[
        {"name":"small","B":1,"H":1,"S":32,"D":64},
        {"name":"wide","B":1,"H":2,"S":200,"D":64,"qk_std":2.0,"purpose":"rescale"}]}"#;
    ShapeCatalog::parse(Path::new("test.json"), text).unwrap()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_inline_shapes_resolve_in_order_without_duplicates() {
        let shapes = sample_catalog()
            .select("wide, 2x3x77x64,small,wide")
            .unwrap();
        let names: Vec<_> = shapes.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["wide", "2x3x77x64", "small"]);
        assert_eq!(
            (shapes[1].b, shapes[1].h, shapes[1].s, shapes[1].d),
            (2, 3, 77, 64)
        );
        assert_eq!(shapes[0].qk_std, 2.0);
    }

    #[test]
    fn unknown_shape_message_lists_the_known_ones() {
        let err = sample_catalog()
            .select("small,bogus")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("bogus") && err.contains("small, wide"),
            "{err}"
        );
    }

    #[test]
    fn the_shapes_file_reads_hkv_sk_causal_and_named_sets() {
        let text = r#"{"version":1,"shapes":[{"name":"a","B":1,"H":4,"S":32,"D":64}],
            "by_name":[{"name":"g","B":1,"H":4,"Hkv":2,"S":8,"Sk":64,"D":128,"causal":true}],
            "sets":{"llm":["g","a"]}}"#;
        let c = ShapeCatalog::parse(Path::new("t.json"), text).unwrap();
        let set = c.select("llm").unwrap();
        assert_eq!(
            set.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(),
            ["g", "a"]
        );
        assert_eq!((set[0].hkv, set[0].sk, set[0].causal), (2, 64, true));
        assert_eq!((set[1].hkv, set[1].sk, set[1].causal), (4, 32, false));
        let json = serde_json::to_string(&set[1]).unwrap();
        assert!(
            !json.contains("Hkv") && !json.contains("causal"),
            "plain shapes write no defaults: {json}"
        );
        let bad = text.replace(r#"["g","a"]"#, r#"["g","zzz"]"#);
        let err = ShapeCatalog::parse(Path::new("t.json"), &bad)
            .unwrap_err()
            .to_string();
        assert!(err.contains("sets.llm") && err.contains("zzz"), "{err}");
    }

    #[test]
    fn shapes_file_with_unknown_key_names_the_key() {
        let text = r#"{"version":1,"shapes":[{"name":"a","B":1,"H":1,"S":4,"D":64,"Z":3}]}"#;
        let err = ShapeCatalog::parse(Path::new("f.json"), text)
            .unwrap_err()
            .to_string();
        assert!(err.contains("f.json") && err.contains("Z"), "{err}");
    }

    #[test]
    fn shapes_file_with_a_bad_shape_names_its_index() {
        let text = r#"{"version":1,"shapes":[{"name":"a","B":1,"H":1,"S":4,"D":32}]}"#;
        let err = ShapeCatalog::parse(Path::new("f.json"), text)
            .unwrap_err()
            .to_string();
        assert!(err.contains("shapes[0]") && err.contains("D=32"), "{err}");
    }

    #[test]
    fn shapes_file_with_a_missing_key_names_it() {
        let text = r#"{"version":1,"shapes":[{"name":"a","B":1,"H":1,"D":64}]}"#;
        let err = ShapeCatalog::parse(Path::new("f.json"), text)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`S`"), "{err}");
    }

    #[test]
    fn all_selects_the_shapes_list_and_by_name_shapes_only_when_named() {
        let text = r#"{"version":1,"shapes":[{"name":"small","B":1,"H":1,"S":32,"D":64}],
            "by_name":[{"name":"huge","B":1,"H":1,"S":65536,"D":64}]}"#;
        let c = ShapeCatalog::parse(Path::new("t.json"), text).unwrap();
        let names = |spec| {
            c.select(spec)
                .unwrap()
                .into_iter()
                .map(|s| s.name)
                .collect::<Vec<_>>()
        };
        assert_eq!(names("all"), ["small"]);
        assert_eq!(names("all,huge"), ["small", "huge"]);
        assert!(!c.in_all("huge") && c.in_all("small") && c.shapes().len() == 2);
        let twice = r#"{"version":1,"shapes":[{"name":"a","B":1,"H":1,"S":32,"D":64}],
            "by_name":[{"name":"a","B":1,"H":1,"S":64,"D":64}]}"#;
        let err = ShapeCatalog::parse(Path::new("t.json"), twice)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("by_name[0].name") && err.contains("defined twice"),
            "{err}"
        );
    }
}

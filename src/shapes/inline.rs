//! A problem written on one line, `BxHxSxD[:sk=N][:hkv=N][:causal][:qk=F][:dist=NAME][:rotate]`:
//! `--shapes` reads it, and fuzz and export write it back as a problem's reproduction.

use super::{Dist, Shape};
use crate::usage::ConfigError;

impl Shape {
    /// The inline spelling of this shape,
    /// `BxHxSxD[:sk=N][:hkv=N][:causal][:qk=F][:dist=NAME][:rotate]`,
    /// which [`Shape::parse_inline`] reads back to the same problem (a one-line reproduction).
    pub fn inline(&self) -> String {
        let mut t = self.dims();
        if self.qk_std != 1.0 {
            t.push_str(&format!(":qk={}", self.qk_std));
        }
        if !self.dist.is_normal() {
            t.push_str(&format!(":dist={}", self.dist.name()));
        }
        if self.rotate {
            t.push_str(":rotate");
        }
        t
    }

    /// Parses an inline `BxHxSxD[:sk=N][:hkv=N][:causal][:qk=F][:dist=NAME][:rotate]` shape; `None` if
    /// `text` does not start with `BxHxSxD`.
    pub fn parse_inline(text: &str) -> Option<Result<Shape, ConfigError>> {
        let mut options = text.split(':');
        let dims_text = options.next().unwrap_or_default();
        let parts: Vec<&str> = dims_text.split(['x', 'X']).collect();
        if parts.len() != 4
            || parts
                .iter()
                .any(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()))
        {
            return None;
        }
        let bad = |message: String| {
            Some(Err(ConfigError::BadShape {
                name: text.into(),
                message,
            }))
        };
        let mut dims = [0usize; 4];
        for (slot, part) in dims.iter_mut().zip(&parts) {
            match part.parse() {
                Ok(v) => *slot = v,
                Err(_) => return bad(format!("`{part}` is too large")),
            }
        }
        let mut shape = Shape::new(
            &text.to_ascii_lowercase(),
            dims[0],
            dims[1],
            dims[2],
            dims[3],
        );
        const GRAMMAR: &str = "BxHxSxD[:sk=N][:hkv=N][:causal][:qk=F][:dist=NAME][:rotate]";
        for option in options {
            let count = |v: &str, key: &str| {
                v.parse::<usize>()
                    .map_err(|_| format!("{key}=`{v}` is not a non-negative integer"))
            };
            match option.split_once('=') {
                Some(("sk", v)) => match count(v, "sk") {
                    Ok(n) => shape.sk = n,
                    Err(m) => return bad(m),
                },
                Some(("hkv", v)) => match count(v, "hkv") {
                    Ok(n) => shape.hkv = n,
                    Err(m) => return bad(m),
                },
                None if option == "causal" => shape.causal = true,
                None if option == "rotate" => shape.rotate = true,
                Some(("qk", v)) => match v.parse::<f64>() {
                    Ok(x) => shape.qk_std = x,
                    Err(_) => return bad(format!("qk=`{v}` is not a number")),
                },
                Some(("dist", v)) => match Dist::parse(v) {
                    Some(d) => shape.dist = d,
                    None => {
                        let known: Vec<&str> = Dist::ALL.iter().map(Dist::name).collect();
                        return bad(format!(
                            "dist=`{v}` is unknown; known: {}",
                            known.join(", ")
                        ));
                    }
                },
                _ => return bad(format!("`{option}` is not an option; write {GRAMMAR}")),
            }
        }
        Some(
            shape
                .validate()
                .map(|_| shape.clone())
                .map_err(|message| ConfigError::BadShape {
                    name: text.into(),
                    message,
                }),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shapes::RawShape;
    use crate::shapes::catalog::sample_catalog;

    #[test]
    fn rotate_is_an_inline_option_that_inline_writes_back_and_the_shapes_file_reads() {
        let r = Shape::parse_inline("1x16x4096x128:dist=fa3_outliers:rotate")
            .unwrap()
            .unwrap();
        assert!(r.rotate && r.dist == Dist::Fa3Outliers);
        assert_eq!(r.inline(), "1x16x4096x128:dist=fa3_outliers:rotate");
        assert!(
            !Shape::parse_inline("1x16x4096x128")
                .unwrap()
                .unwrap()
                .rotate
        );
        let raw: RawShape = serde_json::from_str(
            r#"{"name": "rot", "B": 1, "H": 2, "S": 8, "D": 64, "rotate": true}"#,
        )
        .unwrap();
        assert!(Shape::from(raw).rotate);
        let bad = Shape::parse_inline("1x1x8x64:rotated")
            .unwrap()
            .unwrap_err();
        assert!(bad.to_string().contains("[:rotate]"), "{bad}");
    }

    #[test]
    fn inline_options_describe_gqa_decode_chunked_prefill_and_causal_problems() {
        let c = sample_catalog();
        let prefill = &c.select("1x32x4096x128:hkv=8:causal").unwrap()[0];
        assert_eq!(
            (prefill.h, prefill.hkv, prefill.s, prefill.sk),
            (32, 8, 4096, 4096)
        );
        assert!(prefill.causal && prefill.group() == 4);
        let decode = &c.select("16x32x1x128:sk=8192:hkv=8").unwrap()[0];
        assert_eq!((decode.s, decode.sk, decode.causal), (1, 8192, false));
        let chunk = &c.select("1x32x512x128:sk=4096:hkv=8:causal").unwrap()[0];
        assert_eq!(chunk.inline(), "1x32x512x128:sk=4096:hkv=8:causal");
        for s in [prefill, decode, chunk] {
            assert_eq!(&Shape::parse_inline(&s.inline()).unwrap().unwrap(), s);
        }
        // Query head h reads K/V head h / (H / H_kv), batch by batch.
        let g = Shape::parse_inline("2x8x4x64:hkv=2").unwrap().unwrap();
        let map: Vec<usize> = (0..16).map(|bh| g.kv_head_of(bh)).collect();
        assert_eq!(map, [0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3]);
    }

    #[test]
    fn bad_descriptions_exit_naming_the_rule() {
        let c = sample_catalog();
        let err = |spec: &str| c.select(spec).unwrap_err().to_string();
        assert!(err("1x6x64x64:hkv=4").contains("multiple of Hkv"));
        assert!(err("1x6x64x64:hkv=0").contains("Hkv=0"));
        assert!(err("1x6x64x64:sk=0").contains("Sk=0"));
        assert!(err("1x6x64x64:sk=-3").contains("non-negative integer"));
        assert!(err("1x6x64x64:mask").contains("not an option"));
        assert!(matches!(
            c.select("1x6x64x64:hkv=4").unwrap_err(),
            ConfigError::BadShape { .. }
        ));
    }
}

//! latency.svg: the latency distributions of baseline and candidate, one panel per shape,
//! as box plots (box p25-p75, line at the median, whiskers p5-p95), readable at a glance.

use std::fmt::Write;

/// One panel: a shape's samples for baseline and candidate, in microseconds.
pub struct Panel<'a> {
    pub shape: &'a str,
    pub base: &'a [f64],
    pub cand: &'a [f64],
    pub verdict: &'a str,
}

const WIDTH: f64 = 760.0;
const LEFT: f64 = 150.0;
const RIGHT: f64 = 30.0;
const PANEL_H: f64 = 92.0;
const TOP: f64 = 44.0;
const BASE_COLOR: &str = "#7f7f7f";
const CAND_COLOR: &str = "#1f77b4";

fn quantile(sorted: &[f64], q: f64) -> f64 {
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}

fn sorted(xs: &[f64]) -> Vec<f64> {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v
}

pub fn render(panels: &[Panel], base_label: &str, cand_label: &str, clock: &str) -> String {
    let height = TOP + PANEL_H * panels.len() as f64 + 10.0;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="10" y="18" font-size="14" font-weight="bold">Latency per launch, µs ({})</text>"#,
        escape(clock)
    );
    for (i, (label, color)) in [(base_label, BASE_COLOR), (cand_label, CAND_COLOR)]
        .iter()
        .enumerate()
    {
        let x = 10.0 + 220.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<rect x="{x}" y="26" width="12" height="10" fill="{color}"/>"#
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="35">{}</text>"#,
            x + 16.0,
            escape(label)
        );
    }
    let _ = writeln!(
        s,
        r##"<text x="460" y="35" fill="#555">box p25–p75, line median, whiskers p5–p95</text>"##
    );
    for (i, panel) in panels.iter().enumerate() {
        draw_panel(&mut s, panel, TOP + PANEL_H * i as f64);
    }
    s.push_str("</svg>\n");
    s
}

fn draw_panel(s: &mut String, p: &Panel, y0: f64) {
    let (b, c) = (sorted(p.base), sorted(p.cand));
    let lo = quantile(&b, 0.01).min(quantile(&c, 0.01));
    let hi = quantile(&b, 0.99).max(quantile(&c, 0.99));
    let pad = ((hi - lo) * 0.08).max(hi * 0.005);
    let (lo, hi) = (lo - pad, hi + pad);
    let x = |v: f64| LEFT + (v.clamp(lo, hi) - lo) / (hi - lo) * (WIDTH - LEFT - RIGHT);
    let _ = writeln!(
        s,
        r#"<text x="10" y="{}" font-weight="bold">{}</text>"#,
        y0 + 26.0,
        escape(p.shape)
    );
    let _ = writeln!(
        s,
        r##"<text x="10" y="{}" fill="#555">{}</text>"##,
        y0 + 44.0,
        escape(p.verdict)
    );
    for (row, (data, color)) in [(&b, BASE_COLOR), (&c, CAND_COLOR)].iter().enumerate() {
        let yc = y0 + 18.0 + 24.0 * row as f64;
        let q = |f: f64| x(quantile(data, f));
        let _ = writeln!(
            s,
            r#"<line x1="{:.1}" y1="{yc}" x2="{:.1}" y2="{yc}" stroke="{color}"/>"#,
            q(0.05),
            q(0.95)
        );
        for w in [0.05, 0.95] {
            let _ = writeln!(
                s,
                r#"<line x1="{0:.1}" y1="{1}" x2="{0:.1}" y2="{2}" stroke="{color}"/>"#,
                q(w),
                yc - 5.0,
                yc + 5.0
            );
        }
        let _ = writeln!(
            s,
            r#"<rect x="{:.1}" y="{}" width="{:.1}" height="16" fill="{color}" fill-opacity="0.35" stroke="{color}"/>"#,
            q(0.25),
            yc - 8.0,
            (q(0.75) - q(0.25)).max(1.0)
        );
        let _ = writeln!(
            s,
            r#"<line x1="{0:.1}" y1="{1}" x2="{0:.1}" y2="{2}" stroke="{color}" stroke-width="3"/>"#,
            q(0.5),
            yc - 8.0,
            yc + 8.0
        );
    }
    let axis_y = y0 + 70.0;
    let _ = writeln!(
        s,
        r##"<line x1="{LEFT}" y1="{axis_y}" x2="{}" y2="{axis_y}" stroke="#999"/>"##,
        WIDTH - RIGHT
    );
    for t in 0..=4 {
        let v = lo + (hi - lo) * t as f64 / 4.0;
        let _ = writeln!(
            s,
            r##"<text x="{:.1}" y="{}" text-anchor="middle" fill="#555">{v:.2}</text>"##,
            x(v),
            axis_y + 14.0
        );
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_one_panel_per_shape_with_both_boxes_and_escaped_labels() {
        let base: Vec<f64> = (0..100).map(|i| 20.0 + i as f64 * 0.01).collect();
        let cand: Vec<f64> = base.iter().map(|x| x * 0.8).collect();
        let panels = [
            Panel {
                shape: "small",
                base: &base,
                cand: &cand,
                verdict: "FASTER",
            },
            Panel {
                shape: "mission",
                base: &base,
                cand: &base,
                verdict: "SAME",
            },
        ];
        let svg = render(&panels, "cp0", "cp1+X<1>", "GPU time");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(
            svg.matches("fill-opacity").count(),
            4,
            "two boxes per panel"
        );
        assert!(svg.contains("cp1+X&lt;1&gt;") && svg.contains(">mission<"));
    }

    #[test]
    fn quantiles_interpolate() {
        assert_eq!(quantile(&[1.0, 2.0, 3.0, 4.0, 5.0], 0.5), 3.0);
        assert_eq!(quantile(&[0.0, 10.0], 0.25), 2.5);
    }
}

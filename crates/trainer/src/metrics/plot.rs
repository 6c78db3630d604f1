//! The loss curve as a self-contained SVG (hand-written, no plotting dependency): training loss
//! per logged step as a line, evaluation loss as dots joined by a dashed line, axes with
//! 1-2-5 ticks. Opens in any browser; written to `OUTPUT/loss.svg` at the end of a run.

use std::fmt::Write as _;
use std::path::Path;

use crate::error::{Error, Result};

const W: f64 = 720.0;
const H: f64 = 420.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 20.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 50.0;
const TRAIN_COLOR: &str = "#1f77b4";
const EVAL_COLOR: &str = "#ff7f0e";

/// Renders the SVG for `(step, loss)` points; non-finite losses are left out.
pub fn loss_svg(train: &[(u64, f64)], eval: &[(u64, f64)], title: &str) -> String {
    let finite = |pts: &[(u64, f64)]| -> Vec<(f64, f64)> {
        pts.iter()
            .filter(|p| p.1.is_finite())
            .map(|&(s, l)| (s as f64, l))
            .collect()
    };
    let (train, eval) = (finite(train), finite(eval));
    let all: Vec<(f64, f64)> = train.iter().chain(&eval).copied().collect();

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="24" text-anchor="middle" font-size="15">{}</text>"#,
        W / 2.0,
        escape(title)
    );
    if all.is_empty() {
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle">no finite loss recorded</text>"#,
            W / 2.0,
            H / 2.0
        );
        svg.push_str("</svg>\n");
        return svg;
    }
    let frame = Frame::around(&all);
    frame.draw_axes(&mut svg);
    frame.draw_curves(&mut svg, &train, &eval);
    draw_legend(&mut svg, !train.is_empty(), !eval.is_empty());
    svg.push_str("</svg>\n");
    svg
}

/// The plot area: the data ranges widened to whole ticks, and the ticks.
struct Frame {
    x: (f64, f64),
    y: (f64, f64),
    x_ticks: Vec<f64>,
    y_ticks: Vec<f64>,
}

impl Frame {
    /// The frame of `points` (at least one): padded ranges with 1-2-5 ticks that cover them.
    fn around(points: &[(f64, f64)]) -> Frame {
        let (x0, x1) = padded_range(points.iter().map(|p| p.0));
        let (y0, y1) = padded_range(points.iter().map(|p| p.1));
        let (x_ticks, y_ticks) = (ticks(x0, x1, 8), ticks(y0, y1, 6));
        let last = |t: &[f64]| *t.last().expect("ticks() returns at least one");
        Frame {
            x: (x0.min(x_ticks[0]), x1.max(last(&x_ticks))),
            y: (y0.min(y_ticks[0]), y1.max(last(&y_ticks))),
            x_ticks,
            y_ticks,
        }
    }

    /// Pixel column of step `x`.
    fn px(&self, x: f64) -> f64 {
        LEFT + (x - self.x.0) / (self.x.1 - self.x.0) * (W - LEFT - RIGHT)
    }

    /// Pixel row of loss `y`.
    fn py(&self, y: f64) -> f64 {
        H - BOTTOM - (y - self.y.0) / (self.y.1 - self.y.0) * (H - TOP - BOTTOM)
    }

    /// Grid lines, tick labels, the frame and the axis titles.
    fn draw_axes(&self, svg: &mut String) {
        for &t in &self.x_ticks {
            let x = self.px(t);
            let _ = writeln!(
                svg,
                r##"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="#e5e5e5"/>"##,
                H - BOTTOM
            );
            let _ = writeln!(
                svg,
                r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                H - BOTTOM + 16.0,
                label(t)
            );
        }
        for &t in &self.y_ticks {
            let y = self.py(t);
            let _ = writeln!(
                svg,
                r##"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#e5e5e5"/>"##,
                W - RIGHT
            );
            let _ = writeln!(
                svg,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
                LEFT - 6.0,
                y + 4.0,
                label(t)
            );
        }
        let _ = writeln!(
            svg,
            r#"<rect x="{LEFT}" y="{TOP}" width="{:.1}" height="{:.1}" fill="none" stroke="black"/>"#,
            W - LEFT - RIGHT,
            H - TOP - BOTTOM
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">optimizer step</text>"#,
            (LEFT + W - RIGHT) / 2.0,
            H - 12.0
        );
        let _ = writeln!(
            svg,
            r#"<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">loss</text>"#,
            (TOP + H - BOTTOM) / 2.0,
            (TOP + H - BOTTOM) / 2.0
        );
    }

    /// The training loss as a line, the evaluation loss as dots joined by a dashed line.
    fn draw_curves(&self, svg: &mut String, train: &[(f64, f64)], eval: &[(f64, f64)]) {
        let points = |pts: &[(f64, f64)]| -> String {
            pts.iter()
                .map(|&(x, y)| format!("{:.1},{:.1}", self.px(x), self.py(y)))
                .collect::<Vec<_>>()
                .join(" ")
        };
        if !train.is_empty() {
            let _ = writeln!(
                svg,
                r#"<polyline points="{}" fill="none" stroke="{TRAIN_COLOR}" stroke-width="1.8"/>"#,
                points(train)
            );
        }
        if !eval.is_empty() {
            let _ = writeln!(
                svg,
                r#"<polyline points="{}" fill="none" stroke="{EVAL_COLOR}" stroke-width="1.5" stroke-dasharray="5,4"/>"#,
                points(eval)
            );
            for &(x, y) in eval {
                let _ = writeln!(
                    svg,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="3.5" fill="{EVAL_COLOR}"/>"#,
                    self.px(x),
                    self.py(y)
                );
            }
        }
    }
}

/// The legend's entries in the top right corner, for the curves drawn.
fn draw_legend(svg: &mut String, train: bool, eval: bool) {
    let mut ly = TOP + 16.0;
    for (name, color, shown) in [("train", TRAIN_COLOR, train), ("eval", EVAL_COLOR, eval)] {
        if shown {
            let lx = W - RIGHT - 90.0;
            let _ = writeln!(
                svg,
                r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="2"/>"#,
                lx + 22.0
            );
            let _ = writeln!(
                svg,
                r#"<text x="{}" y="{}">{name}</text>"#,
                lx + 28.0,
                ly + 4.0
            );
            ly += 18.0;
        }
    }
}

/// Writes [`loss_svg`] to `path` atomically (a viewer never sees half a file).
pub fn write_loss_svg(
    path: &Path,
    train: &[(u64, f64)],
    eval: &[(u64, f64)],
    title: &str,
) -> Result<()> {
    let tmp = path.with_extension("svg.tmp");
    std::fs::write(&tmp, loss_svg(train, eval, title))
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|source| Error::MetricsIo {
            path: path.to_path_buf(),
            source,
        })
}

/// Min and max of the values, widened to a non-empty interval.
fn padded_range(values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (lo, hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if hi - lo > 0.0 {
        (lo, hi)
    } else {
        let pad = if lo == 0.0 { 1.0 } else { lo.abs() * 0.05 };
        (lo - pad, hi + pad)
    }
}

/// About `target` tick values covering [lo, hi], spaced 1, 2 or 5 × 10^k.
fn ticks(lo: f64, hi: f64, target: usize) -> Vec<f64> {
    let raw = (hi - lo) / target.max(1) as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let first = (lo / step).floor() as i64;
    let last = (hi / step).ceil() as i64;
    (first..=last).map(|i| i as f64 * step).collect()
}

/// Short tick label: integers without decimals, otherwise up to 4 significant digits.
fn label(v: f64) -> String {
    if v == v.round() && v.abs() < 1e9 {
        format!("{}", v as i64)
    } else {
        let s = format!("{v:.4}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn svg_has_both_curves_and_is_well_formed() {
        let train: Vec<(u64, f64)> = (1..=20).map(|s| (s, 3.0 / s as f64)).collect();
        let svg = loss_svg(&train, &[(10, 0.5), (20, 0.3)], "loss <tiny>");
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 2);
        assert!(svg.contains("loss &lt;tiny&gt;"));
        let opens = svg.matches('<').count();
        let closes = svg.matches('>').count();
        assert_eq!(opens, closes);
    }

    #[test]
    fn degenerate_inputs_still_render() {
        assert!(loss_svg(&[], &[], "t").contains("no finite loss"));
        let one = loss_svg(&[(1, 2.0), (2, f64::NAN)], &[], "t");
        assert_eq!(one.matches("<polyline").count(), 1);
        assert!(!one.contains("NaN"));
    }

    #[test]
    fn ticks_are_round_and_cover_the_range() {
        let t = ticks(0.37, 2.9, 6);
        assert_eq!(t.first(), Some(&0.0));
        assert!(*t.last().unwrap() >= 2.9);
        assert!((t[1] - t[0] - 0.5).abs() < 1e-12, "{t:?}");
        assert_eq!(label(0.5), "0.5");
        assert_eq!(label(100.0), "100");
    }
}

//! Live output of a run: correctness rows as they are made, and for timing a progress bar on
//! a terminal (indicatif) or one plain line per (shape, seed) when output is redirected.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

use crate::console;
use crate::rows::RowSet;
use crate::runner::Progress;
use crate::schema::CorrectnessRecord;
use crate::schema::{GpuSlot, Measurement};
use crate::shapes::Shape;

pub struct ConsoleProgress {
    widths: console::Widths,
    /// A bar is drawn on a terminal with one worker; several workers time at once, so each
    /// says when it is done instead.
    bar_allowed: bool,
    /// Lines name their GPU when several workers share the run.
    name_gpu: bool,
    bar: Option<ProgressBar>,
}

impl ConsoleProgress {
    pub fn new(widths: console::Widths, workers: usize) -> Self {
        ConsoleProgress {
            widths,
            bar_allowed: std::io::stdout().is_terminal() && workers == 1,
            name_gpu: workers > 1,
            bar: None,
        }
    }

    fn on_gpu(&self, gpu: Option<&GpuSlot>) -> String {
        console::on_gpu(gpu, self.name_gpu)
    }

    fn timing_label(&self, shape: &str, seed: u64) -> String {
        format!("[{shape:<w$}] seed={seed} timing", w = self.widths.shape)
    }

    fn println(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => crate::outln!("{line}"),
        }
    }
}

impl Progress for ConsoleProgress {
    fn record(&mut self, r: &CorrectnessRecord) {
        let line = console::correctness_row(r, &self.widths);
        self.println(&format!("{line}{}", self.on_gpu(r.gpu.as_ref())));
        if let Some(lost) = r.input_range.summary() {
            self.println(&format!("      inputs in E4M3: {lost}"));
        }
    }

    fn rows_chosen(&mut self, shape: &Shape, seed: u64, rows: &RowSet) {
        if !rows.is_all() {
            self.println(&console::rows_line(shape, seed, rows, &self.widths));
        }
    }

    fn timing_started(&mut self, shape: &Shape, seed: u64, rounds: usize) {
        if self.bar_allowed {
            let bar = ProgressBar::new(rounds as u64);
            bar.set_style(
                ProgressStyle::with_template("{prefix} [{bar:30}] round {pos}/{len} {elapsed}")
                    .expect("valid template")
                    .progress_chars("=> "),
            );
            bar.set_prefix(self.timing_label(&shape.name, seed));
            self.bar = Some(bar);
        }
    }

    fn timing_round(&mut self) {
        if let Some(bar) = &self.bar {
            bar.inc(1);
        }
    }

    fn timing_done(&mut self, measured: &[Measurement]) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        let Some(first) = measured.first() else {
            return;
        };
        let label = self.timing_label(&first.shape, first.seed);
        let parts: Vec<String> = measured
            .iter()
            .map(|m| {
                format!(
                    "{} p50={:.2}us p90={:.2}us",
                    m.variant, m.summary.p50, m.summary.p90
                )
            })
            .collect();
        crate::outln!(
            "{label} {}{}",
            parts.join(" | "),
            self.on_gpu(first.gpu.as_ref())
        );
    }
}

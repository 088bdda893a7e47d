//! Live output of a run: correctness rows as they are made, and for timing a progress bar on
//! a terminal (indicatif) or one plain line per (shape, seed) when output is redirected.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressStyle};

use crate::console;
use crate::rows::RowSet;
use crate::runner::Progress;
use crate::schema::CorrectnessRecord;
use crate::schema::Measurement;
use crate::shapes::Shape;

pub struct ConsoleProgress {
    widths: console::Widths,
    tty: bool,
    bar: Option<ProgressBar>,
    label: String,
}

impl ConsoleProgress {
    pub fn new(widths: console::Widths) -> Self {
        ConsoleProgress {
            widths,
            tty: std::io::stdout().is_terminal(),
            bar: None,
            label: String::new(),
        }
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
        self.println(&console::correctness_row(r, &self.widths));
    }

    fn rows_chosen(&mut self, shape: &Shape, seed: u64, rows: &RowSet) {
        if !rows.is_all() {
            self.println(&console::rows_line(shape, seed, rows, &self.widths));
        }
    }

    fn timing_started(&mut self, shape: &Shape, seed: u64, rounds: usize) {
        self.label = format!(
            "[{:<w$}] seed={seed} timing",
            shape.name,
            w = self.widths.shape
        );
        if self.tty {
            let bar = ProgressBar::new(rounds as u64);
            bar.set_style(
                ProgressStyle::with_template("{prefix} [{bar:30}] round {pos}/{len} {elapsed}")
                    .expect("valid template")
                    .progress_chars("=> "),
            );
            bar.set_prefix(self.label.clone());
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
        let parts: Vec<String> = measured
            .iter()
            .map(|m| {
                format!(
                    "{} p50={:.2}us p90={:.2}us",
                    m.variant, m.summary.p50, m.summary.p90
                )
            })
            .collect();
        crate::outln!("{} {}", self.label, parts.join(" | "));
    }
}

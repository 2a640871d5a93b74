//! Drawing frames: on a terminal the frame is redrawn in place; otherwise (CI logs, pipes)
//! only lines that changed are printed, each once, prefixed with the elapsed time.

use std::collections::HashSet;
use std::io::Write as _;
use std::time::Instant;

/// Draws successive frames.
pub struct Screen {
    tty: bool,
    drawn_lines: usize,
    printed: HashSet<String>,
    started: Instant,
}

impl Screen {
    /// A screen; `tty` redraws in place.
    pub fn new(tty: bool) -> Self {
        Screen {
            tty,
            drawn_lines: 0,
            printed: HashSet::new(),
            started: Instant::now(),
        }
    }

    /// Draws `frame`. `volatile` lines (clocks, bars that move) are shown on a terminal but
    /// not logged line by line.
    pub fn draw(&mut self, frame: &[String], volatile: &[String]) {
        let mut out = std::io::stdout().lock();
        if self.tty {
            if self.drawn_lines > 0 {
                let _ = write!(out, "\x1b[{}A\r\x1b[J", self.drawn_lines);
            }
            for line in volatile.iter().chain(frame) {
                let _ = writeln!(out, "{line}");
            }
            self.drawn_lines = volatile.len() + frame.len();
        } else {
            let elapsed = self.started.elapsed().as_secs_f64();
            for line in logged_lines(frame) {
                if self.printed.insert(line.clone()) {
                    let _ = writeln!(out, "[{elapsed:6.1}s] {}", line.trim_start());
                }
            }
        }
        let _ = out.flush();
    }

    /// Leaves the last frame where it is; following output goes below it.
    pub fn finish(&mut self) {
        self.drawn_lines = 0;
    }
}

/// Lines worth logging: on a non-terminal, download bars are logged only at 0/100% and in
/// quarter steps so a CI log shows progress without hundreds of lines.
pub fn logged_lines(frame: &[String]) -> Vec<String> {
    frame
        .iter()
        .filter(|l| !l.trim().is_empty())
        .filter(|l| match percent_of(l) {
            Some(p) if l.contains("Downloading") => p % 25 == 0,
            _ => true,
        })
        .cloned()
        .collect()
}

fn percent_of(line: &str) -> Option<u64> {
    let end = line.find('%')?;
    let start = line[..end].rfind(|c: char| !c.is_ascii_digit())? + 1;
    line[start..end].parse().ok()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn only_quarter_steps_of_a_bar_are_logged() {
        let frame = vec![
            "  n1  Downloading  [###-] 37%  x".to_owned(),
            "  n2  Downloading  [##--] 50%  x".to_owned(),
            "  n3  Succeeded    [####] 100%  x".to_owned(),
            "  rollout [#---]  33%  1/3 nodes succeeded".to_owned(),
            "header".to_owned(),
        ];
        let logged = logged_lines(&frame);
        assert_eq!(logged.len(), 4);
        assert!(!logged.iter().any(|l| l.contains("37%")));
    }
}

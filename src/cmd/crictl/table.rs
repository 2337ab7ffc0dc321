//! crictl's tables: Go's `text/tabwriter` with crictl's settings (`minwidth` 20, `padding` 3,
//! spaces): every column but the last is as wide as its widest cell plus 3, at least 20
//! characters; cells are left-aligned; the last column is not padded.
//!
//! Reference: cri-tools `cmd/crictl/display.go` (`newDefaultTableDisplay`).

/// Narrowest column.
const MIN_WIDTH: usize = 20;
/// Spaces after the widest cell of a column.
const PADDING: usize = 3;

/// A table being built: a header and rows of cells.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Table {
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table with this header row (printed even when no row follows, as crictl does).
    pub fn new<S: AsRef<str>>(header: &[S]) -> Self {
        Table {
            rows: vec![header.iter().map(|s| s.as_ref().to_string()).collect()],
        }
    }

    /// Adds a row.
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as text, one line per row, each ending in `\n`.
    pub fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let mut widths = vec![0usize; columns];
        for row in &self.rows {
            // tabwriter sizes only the cells terminated by a tab: never the last of a row
            for (i, cell) in row.iter().enumerate().take(row.len().saturating_sub(1)) {
                widths[i] = widths[i].max(cell.chars().count() + PADDING);
            }
        }
        for w in &mut widths {
            *w = (*w).max(MIN_WIDTH);
        }
        let mut out = String::new();
        for row in &self.rows {
            for (i, cell) in row.iter().enumerate() {
                out.push_str(cell);
                if i + 1 < row.len() {
                    let pad = widths[i].saturating_sub(cell.chars().count());
                    out.extend(std::iter::repeat_n(' ', pad));
                }
            }
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_their_widest_cell_plus_three_and_at_least_twenty() {
        let mut t = Table::new(&["IMAGE", "TAG", "IMAGE ID", "SIZE"]);
        t.row(vec![
            "127.0.0.1:5200/test/busybox".into(),
            "v1".into(),
            "6edf3ef45fce4".into(),
            "1.09MB".into(),
        ]);
        assert_eq!(
            t.render(),
            "IMAGE                         TAG                 IMAGE ID            SIZE\n\
             127.0.0.1:5200/test/busybox   v1                  6edf3ef45fce4       1.09MB\n"
        );
    }

    #[test]
    fn the_header_alone_is_printed_for_an_empty_table_without_trailing_spaces() {
        let t = Table::new(&["POD ID", "CREATED", "STATE"]);
        assert_eq!(
            t.render(),
            "POD ID              CREATED             STATE\n"
        );
    }

    #[test]
    fn width_counts_characters_not_bytes_and_empty_cells_are_padded() {
        let mut t = Table::new(&["A", "B"]);
        t.row(vec!["äöü".repeat(7), "x".into()]);
        t.row(vec![String::new(), "y".into()]);
        let out = t.render();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[1], format!("{}   x", "äöü".repeat(7)));
        assert_eq!(lines[2], format!("{}y", " ".repeat(24)));
        assert_eq!(lines[0], format!("A{}B", " ".repeat(23)));
    }
}

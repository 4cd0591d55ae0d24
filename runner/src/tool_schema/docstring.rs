//! Tool descriptions that Python frameworks write from a function: LangChain's `@tool`
//! takes the whole docstring, `Args:` section included, and llama-index's `FunctionTool`
//! puts the signature line `name(arg: type, …) -> type` before it. Needle was trained on a
//! one-line description with each argument's text in its schema, so the description is
//! split into the tool's own text and the arguments' texts.

/// A description split into what it says of the tool and of each argument.
#[derive(Debug, PartialEq)]
pub struct Described {
    /// The description without the signature line and the arguments section.
    pub summary: String,
    /// `(argument, text)` from the arguments section, in its order.
    pub arguments: Vec<(String, String)>,
}

/// Headers of the docstring section that documents the arguments (Google and NumPy style).
const ARGUMENT_HEADERS: [&str; 4] = ["Args:", "Arguments:", "Parameters:", "Params:"];

/// `description` of the tool `name` split; unchanged (no arguments) when it has neither a
/// signature line nor an arguments section.
pub fn split(name: &str, description: &str) -> Described {
    let mut lines: Vec<&str> = description.lines().collect();
    let signed = lines.first().is_some_and(|first| is_signature(name, first));
    if signed {
        lines.remove(0);
    }
    let section = lines
        .iter()
        .position(|l| ARGUMENT_HEADERS.contains(&l.trim()));
    if !signed && section.is_none() {
        return Described {
            summary: description.to_string(),
            arguments: Vec::new(),
        };
    }
    let (kept, arguments) = match section {
        Some(start) => {
            let (end, arguments) = argument_section(&lines[start + 1..]);
            let kept = lines[..start]
                .iter()
                .chain(&lines[start + 1 + end..])
                .copied()
                .collect();
            (kept, arguments)
        }
        None => (lines, Vec::new()),
    };
    Described {
        summary: tidy(&kept),
        arguments,
    }
}

/// `name(…)` opening the first line: llama-index's signature.
fn is_signature(name: &str, line: &str) -> bool {
    line.strip_prefix(name)
        .is_some_and(|rest| rest.starts_with('(') && rest.contains(')'))
}

/// The arguments of a section's lines (after its header) and how many lines it takes: each
/// `name: text` or `name (type): text` entry, deeper-indented lines continuing it, until a
/// blank line or a line as shallow as the entries that is not an entry (the next section).
fn argument_section(lines: &[&str]) -> (usize, Vec<(String, String)>) {
    let mut arguments: Vec<(String, String)> = Vec::new();
    let mut entry_indent = None;
    for (i, line) in lines.iter().enumerate() {
        let indent = line.len() - line.trim_start().len();
        if line.trim().is_empty() {
            return (i, arguments);
        }
        let continues = entry_indent.is_some_and(|e| indent > e);
        match (continues, arguments.last_mut(), entry(line)) {
            (true, Some((_, text)), _) => {
                text.push(' ');
                text.push_str(line.trim());
            }
            (false, _, Some(found)) if entry_indent.is_none_or(|e| e == indent) => {
                entry_indent = Some(indent);
                arguments.push(found);
            }
            _ => return (i, arguments),
        }
    }
    (lines.len(), arguments)
}

/// `name: text` or `name (type): text`, with `name` a Python identifier.
fn entry(line: &str) -> Option<(String, String)> {
    let (head, text) = line.trim().split_once(':')?;
    let name = head.split(" (").next()?.trim();
    let identifier = !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_alphanumeric() || c == '_');
    identifier.then(|| (name.to_string(), text.trim().to_string()))
}

/// The kept lines without their docstring indentation, blank runs and ends.
fn tidy(lines: &[&str]) -> String {
    let mut out: Vec<&str> = Vec::new();
    for line in lines.iter().map(|l| l.trim()) {
        if !(line.is_empty() && out.last().is_none_or(|l| l.is_empty())) {
            out.push(line);
        }
    }
    while out.last().is_some_and(|l| l.is_empty()) {
        out.pop();
    }
    out.join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arguments(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(a, t)| (a.to_string(), t.to_string()))
            .collect()
    }

    #[test]
    fn a_langchain_docstring_loses_its_arguments_section() {
        let d = "Look up a book by its number.\n\n    Args:\n        isbn: The ISBN-13,\n            digits only.\n        shelf (str): Where to look.\n\n    Returns:\n        The title.";
        let got = split("find_book", d);
        assert_eq!(
            got.summary,
            "Look up a book by its number.\n\nReturns:\nThe title."
        );
        assert_eq!(
            got.arguments,
            arguments(&[
                ("isbn", "The ISBN-13, digits only."),
                ("shelf", "Where to look.")
            ])
        );
    }

    #[test]
    fn a_llama_index_description_loses_its_signature_line() {
        let d = "find_book(isbn: str, shelf: Optional[str] = None) -> str\nLook up a book.\n\n    Args:\n        isbn: The ISBN-13.\n    ";
        let got = split("find_book", d);
        assert_eq!(got.summary, "Look up a book.");
        assert_eq!(got.arguments, arguments(&[("isbn", "The ISBN-13.")]));
    }

    #[test]
    fn a_plain_description_is_unchanged() {
        for d in [
            "Convert an amount: kg to lb.\n  Keeps two decimals.",
            "find_book is the tool for books (any shelf).",
            "",
        ] {
            assert_eq!(
                split("find_book", d),
                Described {
                    summary: d.to_string(),
                    arguments: Vec::new()
                }
            );
        }
    }

    #[test]
    fn a_section_ends_at_the_next_header_at_its_indentation() {
        let d = "Send it.\nArgs:\n    to: Who.\nRaises:\n    KeyError: unknown contact.";
        let got = split("send", d);
        assert_eq!(got.summary, "Send it.\nRaises:\nKeyError: unknown contact.");
        assert_eq!(got.arguments, arguments(&[("to", "Who.")]));
    }
}

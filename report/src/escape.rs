//! HTML escaping, a leaf: the page (`html`) and the views it includes
//! (`table`'s leaderboard, `reliability`'s diagrams) all escape record text.

/// Text made safe to place in HTML, between tags or in a quoted attribute.
pub fn escape_html(text: &str) -> String {
    let mut escaped = String::with_capacity(text.len());
    for character in text.chars() {
        match character {
            '&' => escaped.push_str("&amp;"),
            '<' => escaped.push_str("&lt;"),
            '>' => escaped.push_str("&gt;"),
            '"' => escaped.push_str("&quot;"),
            '\'' => escaped.push_str("&#39;"),
            other => escaped.push(other),
        }
    }
    escaped
}

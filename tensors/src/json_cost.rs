//! What a JSON text costs once parsed into `serde_json::Value`: about a
//! hundred bytes per value whatever its text, so `[0,0,0,…]` takes some
//! fifty times its bytes. The supervisor's readers of JSON it did not write
//! this run (inputs, journals, reports) count the values first, in one pass
//! over the bytes with nothing allocated, and refuse a text whose values
//! would take more than max(64 MiB, 16 × its length), the bound every
//! reader of untrusted bytes is held to (SECURITY.md).

/// What one parsed value may cost at most: a `Value` (72 bytes with
/// `preserve_order`), its share of the vector or map holding it (grown by
/// doubling) and of the text it was parsed from.
pub const VALUE_COST: u64 = 160;

/// The most values a JSON text of `len` bytes may hold.
pub fn most_values(len: u64) -> u64 {
    len.saturating_mul(16).max(64 << 20) / VALUE_COST
}

/// The floor for the records isorun wrote itself and reads back (reports,
/// journals) in place of the 64 MiB one: their numbers are dense (a
/// 1000-class confusion matrix is a million `0,` in 2 MB, a `--ci` shard's
/// replicate sums as many), and as `serde_json::Value`s every one of them
/// costs up to [`VALUE_COST`] bytes whatever reads it, so an honest report
/// of an ImageNet-sized model takes some 160 MB parsed. Refusing it would
/// break `report merge` and `--baseline` for such models; 256 MiB admits it
/// while a small file of tiny values is still refused long before it costs
/// gigabytes. Past 16 MiB of text the 16 × bound applies as everywhere.
/// A typed reader of those arrays is what would bring them to the 64 MiB
/// floor (SECURITY.md).
pub const RECORD_FLOOR: u64 = 256 << 20;

/// As [`check_json_cost`], with [`RECORD_FLOOR`] for the floor: for reports
/// and journals read back.
pub fn check_record_json_cost(text: &[u8]) -> Result<(), String> {
    refuse_past(text, (text.len() as u64).saturating_mul(16).max(RECORD_FLOOR) / VALUE_COST)
}

/// At least the number of values (object keys included) that `text` parses
/// to: one for the whole, and one per `[`, `,` and `:` outside strings; a
/// `{` counts four, since a map with one entry already holds room for four.
pub fn count_values(text: &[u8]) -> u64 {
    outside_strings(text).fold(1u64, |values, byte| match byte {
        b'{' => values + 4,
        b'[' | b',' | b':' => values + 1,
        _ => values,
    })
}

/// The bytes of a JSON text that lie outside its strings, in order, each
/// string's opening quote included (its contents and closing quote not):
/// what a pass over the bytes that must not count a `[`, `,` or digit
/// inside a string looks at. A backslash escapes the byte after it, so
/// `"\""` is one string; nothing is checked or allocated.
pub fn outside_strings(text: &[u8]) -> impl Iterator<Item = u8> + '_ {
    let mut in_string = false;
    let mut escaped = false;
    text.iter().copied().filter(move |&byte| {
        if in_string {
            match (escaped, byte) {
                (true, _) => escaped = false,
                (false, b'\\') => escaped = true,
                (false, b'"') => in_string = false,
                _ => {}
            }
            false
        } else {
            in_string = byte == b'"';
            true
        }
    })
}

/// Refuses a text whose parsed values would pass the bound, saying how many
/// it holds and how many it may.
pub fn check_json_cost(text: &[u8]) -> Result<(), String> {
    check_json_cost_of(text, text.len() as u64)
}

/// As [`check_json_cost`], for a text that came out of `read` bytes of a
/// file that may be smaller than the text (a deflated zip entry): the bound
/// is the file's, not the text's.
pub fn check_json_cost_of(text: &[u8], read: u64) -> Result<(), String> {
    refuse_past(text, most_values(read.min(text.len() as u64)))
}

/// Refuses `text` if it holds more than `most` values, saying both numbers.
fn refuse_past(text: &[u8], most: u64) -> Result<(), String> {
    let values = count_values(text);
    if values > most {
        return Err(format!(
            "{} bytes of JSON hold {values} values, more than the {most} read from a text of that length \
             (each costs about {VALUE_COST} bytes parsed)",
            text.len()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_counted_outside_strings() {
        assert_eq!(count_values(b"0"), 1);
        assert_eq!(count_values(b"[0,0]"), 3);
        assert_eq!(count_values(br#"{"a": 1, "b": [2]}"#), 9);
        assert_eq!(count_values(br#"["[,{:", "\"[,"]"#), 3);
    }

    #[test]
    fn what_lies_inside_strings_is_left_out_escaped_quotes_included() {
        let outside = |text: &str| String::from_utf8(outside_strings(text.as_bytes()).collect()).unwrap();
        assert_eq!(outside(r#"[1,"2,[",3]"#), r#"[1,",3]"#);
        assert_eq!(outside(r#"{"a\"b":7}"#), r#"{":7}"#);
        assert_eq!(outside(r#"["\\",8]"#), r#"[",8]"#);
        assert_eq!(outside(r#""unclosed [,"#), r#"""#);
    }

    #[test]
    fn the_count_is_never_below_what_serde_json_makes() {
        fn made(value: &serde_json::Value) -> u64 {
            1 + match value {
                serde_json::Value::Array(items) => items.iter().map(made).sum(),
                serde_json::Value::Object(map) => map.values().map(|v| 1 + made(v)).sum(),
                _ => 0,
            }
        }
        for text in [r#"[]"#, r#"{}"#, r#"[[],[[]],{"a":{"b":[1,2,"x"]}}]"#, r#"{"k":"v","l":[true,null]}"#] {
            let value: serde_json::Value = serde_json::from_str(text).unwrap();
            assert!(count_values(text.as_bytes()) >= made(&value), "{text}");
        }
    }

    #[test]
    fn small_texts_and_wordy_values_pass_and_dense_lists_do_not() {
        assert!(check_json_cost(b"[1,2,3]").is_ok());
        let floats = format!("[{}]", vec!["0.123456789"; 1 << 20].join(","));
        assert!(check_json_cost(floats.as_bytes()).is_ok());
        let zeros = format!("[{}]", vec!["0"; 1 << 20].join(","));
        let message = check_json_cost(zeros.as_bytes()).unwrap_err();
        assert!(message.contains("2097153 bytes of JSON hold 1048577 values, more than the 419430"), "{message}");
    }

    #[test]
    fn a_report_of_a_thousand_class_confusion_matrix_passes_and_a_denser_text_does_not() {
        let row = format!("[{}]", vec!["0"; 1000].join(","));
        let matrix = format!(r#"{{"confusion_matrix": [{}]}}"#, vec![row.as_str(); 1000].join(","));
        assert!(check_json_cost(matrix.as_bytes()).is_err());
        assert!(check_record_json_cost(matrix.as_bytes()).is_ok());
        let zeros = format!("[{}]", vec!["0"; 4 << 20].join(","));
        assert!(check_record_json_cost(zeros.as_bytes()).is_err());
    }
}

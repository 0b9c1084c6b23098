//! Compression is a property of a source, not a format of its own: a
//! `.jsonl.gz` file is JSON Lines read through a gzip decoder, as a
//! `.tfrecord.gz` file is TFRecord. The registry (`crate::format::FORMATS`)
//! keeps a line per name a user gives (`jsonl-gzip`, `tfrecord-gzip`), each
//! with its plain format's reader and a [`Compression`] that the reader is
//! opened with, so that a reader has one `open` (not one per codec) and the
//! decoder is chosen in one place. (As in datafusion, where a file source
//! carries a `FileCompressionType` rather than each format having a
//! compressed twin.)

use std::io::Read;

/// How a data file's bytes are compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Compression {
    /// Stored as they are read.
    None,
    /// gzip (one member or several, as `cat a.gz b.gz` makes).
    Gzip,
}

impl Compression {
    /// Whether the bytes must be decompressed (a compressed stream cannot be
    /// entered midway, so its parts are counted from its start).
    pub fn is_compressed(self) -> bool {
        self != Compression::None
    }

    /// The bytes of `reader` once decompressed, read as a stream (never
    /// whole).
    pub fn decoder<R: Read + Send + 'static>(self, reader: R) -> Box<dyn Read + Send> {
        match self {
            Compression::None => Box::new(reader),
            Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(reader)),
        }
    }
}

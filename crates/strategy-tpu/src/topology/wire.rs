//! The protobuf wire format, only what `TopologyProto` needs: varints, packed int32s, and a
//! reader that skips unknown fields.

pub(super) use distribute_pjrt::protobuf::put_varint_field;
use distribute_pjrt::protobuf::{WIRE_LEN, put_key, put_varint};

use super::invalid;
use crate::TpuError;

/// A packed repeated int32 field (negative values as 10-byte varints, as protobuf does).
pub(super) fn put_packed(out: &mut Vec<u8>, field: u64, values: impl Iterator<Item = i64>) {
    let mut body = Vec::new();
    for v in values {
        put_varint(&mut body, v as u64);
    }
    put_key(out, field, WIRE_LEN);
    put_varint(out, body.len() as u64);
    out.extend(body);
}

pub(super) struct Reader<'a> {
    pub(super) bytes: &'a [u8],
    pub(super) at: usize,
}

impl Reader<'_> {
    pub(super) fn done(&self) -> bool {
        self.at >= self.bytes.len()
    }

    pub(super) fn varint(&mut self) -> Result<u64, TpuError> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self
                .bytes
                .get(self.at)
                .ok_or_else(|| invalid("truncated TopologyProto".into()))?;
            self.at += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte < 0x80 {
                return Ok(value);
            }
        }
        Err(invalid("malformed varint in TopologyProto".into()))
    }

    fn length_delimited(&mut self) -> Result<&[u8], TpuError> {
        let len = self.varint()? as usize;
        let end = self.at.checked_add(len).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| invalid("truncated TopologyProto".into()))?;
        let slice = &self.bytes[self.at..end];
        self.at = end;
        Ok(slice)
    }

    /// Packed int32s; negative ones arrive as 64-bit two's complement.
    pub(super) fn packed(&mut self) -> Result<Vec<i64>, TpuError> {
        let body = self.length_delimited()?;
        let mut inner = Reader { bytes: body, at: 0 };
        let mut values = Vec::new();
        while !inner.done() {
            values.push(inner.varint()? as i64);
        }
        Ok(values)
    }

    pub(super) fn skip(&mut self, wire: u64) -> Result<(), TpuError> {
        match wire {
            0 => self.varint().map(drop),
            1 => self.advance(8),
            2 => self.length_delimited().map(drop),
            5 => self.advance(4),
            _ => Err(invalid(format!(
                "unsupported wire type {wire} in TopologyProto"
            ))),
        }
    }

    fn advance(&mut self, n: usize) -> Result<(), TpuError> {
        if self.at + n > self.bytes.len() {
            return Err(invalid("truncated TopologyProto".into()));
        }
        self.at += n;
        Ok(())
    }
}

//! The few pieces of protobuf's wire format that hand-encoded messages need (this crate's
//! `CompileOptionsProto`, `distribute-tpu`'s `TopologyProto`): varints and field keys.

/// Wire type of a varint field.
pub const WIRE_VARINT: u64 = 0;
/// Wire type of a length-delimited field (bytes, sub-messages, packed repeated fields).
pub const WIRE_LEN: u64 = 2;

/// Appends the key of field `field` with wire type `wire_type`.
pub fn put_key(out: &mut Vec<u8>, field: u64, wire_type: u64) {
    put_varint(out, (field << 3) | wire_type);
}

/// Appends varint field `field` holding `value`.
pub fn put_varint_field(out: &mut Vec<u8>, field: u64, value: u64) {
    put_key(out, field, WIRE_VARINT);
    put_varint(out, value);
}

/// Appends `value` as a varint: seven bits a byte, least significant first, the high bit set on
/// every byte but the last.
pub fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

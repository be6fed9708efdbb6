//! [`CompileOptions`]: the `xla.CompileOptionsProto` a compile call takes, hand-encoded.
//!
//! Only `executable_build_options { device_ordinal, num_replicas, num_partitions,
//! device_assignment }` is needed, so a few bytes of protobuf wire format replace a protobuf code
//! generator and XLA's .proto files. Field numbers (xla/pjrt/proto/compile_options.proto,
//! xla/xla_data.proto): `CompileOptionsProto.executable_build_options = 3`;
//! `ExecutableBuildOptionsProto.device_ordinal = 1`, `num_replicas = 4`, `num_partitions = 5`,
//! `device_assignment = 9`; `DeviceAssignmentProto.replica_count = 1`, `computation_count = 2`,
//! `computation_devices = 3` (each `replica_device_ids = 1`).

use crate::protobuf::{WIRE_LEN, put_key, put_varint, put_varint_field};

/// How to compile a program: how many replicas (one per device) and partitions it runs on.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CompileOptions {
    /// Replicas: the program runs once per replica, each on its own device.
    pub num_replicas: u32,
    /// Partitions per replica (SPMD); 1 for plain data parallelism.
    pub num_partitions: u32,
    /// The device id each replica runs on (one partition); `None`: replica `r` on the client's
    /// device `r`.
    pub device_assignment: Option<Vec<i64>>,
}

impl CompileOptions {
    /// Options for `num_replicas` replicas of one partition each.
    pub fn replicated(num_replicas: u32) -> CompileOptions {
        CompileOptions {
            num_replicas,
            num_partitions: 1,
            device_assignment: None,
        }
    }

    /// The serialized `CompileOptionsProto`.
    pub fn to_proto_bytes(&self) -> Vec<u8> {
        let mut build = Vec::new();
        // device_ordinal = -1: let the runtime pick devices from its default assignment.
        put_varint_field(&mut build, 1, -1i64 as u64);
        put_varint_field(&mut build, 4, u64::from(self.num_replicas));
        put_varint_field(&mut build, 5, u64::from(self.num_partitions));
        if let Some(ids) = &self.device_assignment {
            let mut computation = Vec::new();
            put_key(&mut computation, 1, WIRE_LEN);
            let mut packed = Vec::new();
            for &id in ids {
                put_varint(&mut packed, id as u64);
            }
            put_varint(&mut computation, packed.len() as u64);
            computation.extend_from_slice(&packed);
            let mut assignment = Vec::new();
            put_varint_field(&mut assignment, 1, ids.len() as u64);
            put_varint_field(&mut assignment, 2, 1);
            put_key(&mut assignment, 3, WIRE_LEN);
            put_varint(&mut assignment, computation.len() as u64);
            assignment.extend_from_slice(&computation);
            put_key(&mut build, 9, WIRE_LEN);
            put_varint(&mut build, assignment.len() as u64);
            build.extend_from_slice(&assignment);
        }
        let mut options = Vec::new();
        put_key(&mut options, 3, WIRE_LEN);
        put_varint(&mut options, build.len() as u64);
        options.extend_from_slice(&build);
        options
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bytes measured to compile replicated programs with the 0.115 CPU plugin
    /// (shared/notes/pjrt.md).
    #[test]
    fn replicated_options_are_the_pinned_bytes() {
        for n in [1u8, 2, 4, 8, 127] {
            let mut expected = vec![0x1a, 0x0f, 0x08];
            expected.extend([0xff; 9]);
            expected.extend([0x01, 0x20, n, 0x28, 0x01]);
            assert_eq!(
                CompileOptions::replicated(u32::from(n)).to_proto_bytes(),
                expected
            );
        }
    }

    #[test]
    fn large_counts_use_multi_byte_varints() {
        let bytes = CompileOptions {
            num_replicas: 300,
            num_partitions: 2,
            device_assignment: None,
        }
        .to_proto_bytes();
        // 300 = 0b10_0101100 → 0xac 0x02; the message grows by one byte.
        assert_eq!(bytes[1], 0x10);
        assert_eq!(&bytes[13..], &[0x20, 0xac, 0x02, 0x28, 0x02]);
    }

    #[test]
    fn a_device_assignment_is_a_nested_message() {
        let options = CompileOptions {
            device_assignment: Some(vec![3, 1]),
            ..CompileOptions::replicated(2)
        };
        let bytes = options.to_proto_bytes();
        // After the 17 bytes of the plain options: field 9 (len 10) { replica_count 2,
        // computation_count 1, computation_devices (len 4) { replica_device_ids [3, 1] } }.
        assert_eq!(bytes[1], 0x0f + 12);
        assert_eq!(
            &bytes[17..],
            &[
                0x4a, 0x0a, 0x08, 0x02, 0x10, 0x01, 0x1a, 0x04, 0x0a, 0x02, 0x03, 0x01
            ]
        );
    }
}

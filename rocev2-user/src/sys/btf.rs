//! Field offsets in the running kernel's structs, from its BTF
//! (/sys/kernel/btf/vmlinux), for eBPF programs that read kernel memory
//! (the refused-redirect counters read a net_device's ifindex and
//! namespace). aya's BTF parser keeps its types private, and the format is
//! small: a header, then the type records, then the strings.

use std::path::Path;

use anyhow::{bail, Context as _, Result};

/// The kernel's BTF.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

const BTF_MAGIC: u16 = 0xEB9F;
const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

#[derive(Clone, Debug)]
struct Member {
    name: u32,
    type_id: u32,
    /// Bits from the start of the struct.
    bit_offset: u32,
}

#[derive(Clone, Debug)]
struct Type {
    kind: u32,
    name: u32,
    /// The referenced type (pointers, typedefs, modifiers).
    type_id: u32,
    members: Vec<Member>,
}

/// The type records and strings of one BTF blob.
pub struct Btf {
    types: Vec<Type>,
    strings: Vec<u8>,
}

fn u32_at(data: &[u8], at: usize) -> Result<u32> {
    let bytes = data.get(at..at + 4).context("BTF data ends in the middle of a record")?;
    Ok(u32::from_le_bytes(bytes.try_into().expect("four bytes")))
}

impl Btf {
    /// The running kernel's BTF.
    pub fn kernel() -> Result<Self> {
        Self::read(Path::new(VMLINUX_BTF))
    }

    pub fn read(path: &Path) -> Result<Self> {
        let data = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        Self::parse(&data).with_context(|| format!("cannot parse the BTF in {}", path.display()))
    }

    /// Parses little-endian BTF (the only kind x86 and arm64 kernels have).
    pub fn parse(data: &[u8]) -> Result<Self> {
        if data.len() < 24 || u16::from_le_bytes([data[0], data[1]]) != BTF_MAGIC {
            bail!("not little-endian BTF (bad magic)");
        }
        let header_len = u32_at(data, 4)? as usize;
        let (type_off, type_len) = (u32_at(data, 8)? as usize, u32_at(data, 12)? as usize);
        let (str_off, str_len) = (u32_at(data, 16)? as usize, u32_at(data, 20)? as usize);
        let strings = data
            .get(header_len + str_off..header_len + str_off + str_len)
            .context("the string section lies outside the file")?
            .to_vec();
        let mut types = vec![Type { kind: 0, name: 0, type_id: 0, members: vec![] }]; // id 0 is void
        let (mut at, end) = (header_len + type_off, header_len + type_off + type_len);
        while at < end {
            let (name, info, size_or_type) = (u32_at(data, at)?, u32_at(data, at + 4)?, u32_at(data, at + 8)?);
            at += 12;
            let (kind, vlen, kind_flag) = ((info >> 24) & 0x1F, (info & 0xFFFF) as usize, info >> 31 == 1);
            let mut members = Vec::new();
            at += match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                KIND_ARRAY => 12,
                KIND_STRUCT | KIND_UNION => {
                    for i in 0..vlen {
                        let m = at + 12 * i;
                        let offset = u32_at(data, m + 8)?;
                        // With kind_flag the low 24 bits are the offset (the
                        // high 8 a bitfield's size).
                        let bit_offset = if kind_flag { offset & 0xFF_FFFF } else { offset };
                        members.push(Member { name: u32_at(data, m)?, type_id: u32_at(data, m + 4)?, bit_offset });
                    }
                    12 * vlen
                }
                KIND_ENUM | KIND_FUNC_PROTO => 8 * vlen,
                KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
                _ => 0,
            };
            types.push(Type { kind, name, type_id: size_or_type, members });
        }
        Ok(Self { types, strings })
    }

    fn name(&self, offset: u32) -> &str {
        let rest = self.strings.get(offset as usize..).unwrap_or_default();
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        std::str::from_utf8(&rest[..end]).unwrap_or("")
    }

    /// Follows typedefs and modifiers to the type they name.
    fn resolve(&self, mut id: u32) -> u32 {
        while let Some(t) = self.types.get(id as usize) {
            match t.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => id = t.type_id,
                _ => break,
            }
        }
        id
    }

    /// The byte offset of `field` in struct `name` (a field of a nested
    /// struct as `outer.inner`; fields of anonymous structs and unions are
    /// found as the struct's own, as C sees them).
    pub fn offset_of(&self, name: &str, field: &str) -> Result<u32> {
        let id = self
            .types
            .iter()
            .position(|t| t.kind == KIND_STRUCT && self.name(t.name) == name)
            .with_context(|| format!("the kernel's BTF has no struct {name}"))?;
        let mut id = id as u32;
        let mut bits = 0;
        for part in field.split('.') {
            let (offset, member_type) = self
                .find_member(id, part)
                .with_context(|| format!("struct {name} has no field {field} in the kernel's BTF"))?;
            bits += offset;
            id = self.resolve(member_type);
        }
        if bits % 8 != 0 {
            bail!("{name}.{field} is a bitfield");
        }
        Ok(bits / 8)
    }

    /// (bit offset, type) of member `field` of struct or union `id`,
    /// looking into anonymous members.
    fn find_member(&self, id: u32, field: &str) -> Option<(u32, u32)> {
        let t = self.types.get(id as usize)?;
        for m in &t.members {
            if self.name(m.name) == field {
                return Some((m.bit_offset, m.type_id));
            }
            let inner = self.resolve(m.type_id);
            let anonymous = m.name == 0
                && self.types.get(inner as usize).is_some_and(|i| matches!(i.kind, KIND_STRUCT | KIND_UNION));
            if anonymous {
                if let Some((offset, ty)) = self.find_member(inner, field) {
                    return Some((m.bit_offset + offset, ty));
                }
            }
        }
        None
    }

    /// Whether `id` (after typedefs) is a pointer: for checking that a
    /// field read as a pointer is one.
    pub fn field_is_pointer(&self, name: &str, field: &str) -> bool {
        let Some(id) = self.types.iter().position(|t| t.kind == KIND_STRUCT && self.name(t.name) == name) else {
            return false;
        };
        let mut id = id as u32;
        for part in field.split('.') {
            match self.find_member(id, part) {
                Some((_, ty)) => id = self.resolve(ty),
                None => return false,
            }
        }
        self.types.get(id as usize).is_some_and(|t| t.kind == KIND_PTR)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_btf_has_the_net_device_fields_the_counters_read() {
        let btf = Btf::kernel().unwrap();
        let ifindex = btf.offset_of("net_device", "ifindex").unwrap();
        let net = btf.offset_of("net_device", "nd_net.net").unwrap();
        assert!(ifindex > 0 && net > 0 && ifindex != net);
        assert!(btf.field_is_pointer("net_device", "nd_net.net"));
        assert!(btf.offset_of("net", "net_cookie").unwrap() > 0);
        assert!(btf.offset_of("net_device", "no_such_field").is_err());
    }
}

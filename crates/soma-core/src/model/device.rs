//! Where a node runs: a [`Device`], parsed and checked when it is written, and the
//! [`Placement`] that says which node runs on which.
//!
//! Devices are spelled as torch spells them (`cpu`, `cuda:1`, `meta`, `mps`, `xpu:0`), since
//! that is what the people who place nodes write already; a malformed or unknown one is refused
//! where it is written, not when a node first runs on it. A bare `cuda` is refused: it means
//! "whatever device is current on this thread", which is exactly the per-thread state that
//! placement replaces — a branch runs on a thread lent to it, whose current device is nobody's
//! choice.
//!
//! Placement is data beside the graph: it never changes the graph, the plan or a result. The
//! executor hands each node its device ([`crate::Ctx::device`]), and a host sets it as the
//! node's thread's current device while the node runs; later kinds of place (a host of a
//! cluster) can sit beside devices here.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

use crate::model::id::NodeId;

/// The kinds of device torch names, as it spells them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceKind {
    /// The host's processor.
    Cpu,
    /// An NVIDIA GPU, through CUDA.
    Cuda,
    /// An AMD GPU, through `ROCm`'s `HIP`.
    Hip,
    /// An Intel GPU.
    Xpu,
    /// An Apple GPU, through Metal.
    Mps,
    /// No device at all: tensors with shapes and dtypes but no data.
    Meta,
    /// A TPU or another device behind XLA.
    Xla,
    /// An Intel Gaudi accelerator.
    Hpu,
    /// A Meta training and inference accelerator.
    Mtia,
    /// A Graphcore IPU.
    Ipu,
    /// A GPU through Vulkan.
    Vulkan,
}

impl DeviceKind {
    /// Every kind, in the order the docs list them.
    pub const ALL: [DeviceKind; 11] = [
        DeviceKind::Cpu,
        DeviceKind::Cuda,
        DeviceKind::Hip,
        DeviceKind::Xpu,
        DeviceKind::Mps,
        DeviceKind::Meta,
        DeviceKind::Xla,
        DeviceKind::Hpu,
        DeviceKind::Mtia,
        DeviceKind::Ipu,
        DeviceKind::Vulkan,
    ];

    /// The kind's name, as torch spells it.
    pub fn name(self) -> &'static str {
        match self {
            DeviceKind::Cpu => "cpu",
            DeviceKind::Cuda => "cuda",
            DeviceKind::Hip => "hip",
            DeviceKind::Xpu => "xpu",
            DeviceKind::Mps => "mps",
            DeviceKind::Meta => "meta",
            DeviceKind::Xla => "xla",
            DeviceKind::Hpu => "hpu",
            DeviceKind::Mtia => "mtia",
            DeviceKind::Ipu => "ipu",
            DeviceKind::Vulkan => "vulkan",
        }
    }

    /// Whether a device of this kind must say which one: a process may see several, and the
    /// one it means without an index is the thread's current one.
    pub fn needs_index(self) -> bool {
        match self {
            DeviceKind::Cuda
            | DeviceKind::Hip
            | DeviceKind::Xpu
            | DeviceKind::Hpu
            | DeviceKind::Mtia
            | DeviceKind::Ipu => true,
            DeviceKind::Cpu
            | DeviceKind::Mps
            | DeviceKind::Meta
            | DeviceKind::Xla
            | DeviceKind::Vulkan => false,
        }
    }
}

/// A device: a kind and, where it has several, which one. Parsed from torch's spelling with
/// [`str::parse`]; displayed the same way.
///
/// ```
/// use soma_core::Device;
/// let gpu: Device = "cuda:1".parse()?;
/// assert_eq!((gpu.kind().name(), gpu.index()), ("cuda", Some(1)));
/// assert_eq!(gpu.to_string(), "cuda:1");
/// assert!("cuda".parse::<Device>().is_err()); // which one?
/// # Ok::<(), soma_core::DeviceError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Device {
    kind: DeviceKind,
    index: Option<u32>,
}

impl Device {
    /// A device of `kind`, the `index`th of it.
    ///
    /// # Errors
    /// [`DeviceError::NeedsIndex`] for a kind that must say which device without `index`.
    pub fn new(kind: DeviceKind, index: Option<u32>) -> Result<Device, DeviceError> {
        if index.is_none() && kind.needs_index() {
            return Err(DeviceError::NeedsIndex {
                text: kind.name().to_owned(),
                kind,
            });
        }
        Ok(Device { kind, index })
    }

    /// Its kind.
    pub fn kind(self) -> DeviceKind {
        self.kind
    }

    /// Which device of its kind, if it says.
    pub fn index(self) -> Option<u32> {
        self.index
    }

    /// Whether a value found on `found` is where this device says: the same kind, and the same
    /// index where both say one (`mps` holds what is on `mps:0`).
    pub fn holds(self, found: Device) -> bool {
        self.kind == found.kind
            && match (self.index, found.index) {
                (Some(a), Some(b)) => a == b,
                (None, _) | (_, None) => true,
            }
    }
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.kind.name())?;
        match self.index {
            Some(index) => write!(f, ":{index}"),
            None => Ok(()),
        }
    }
}

/// Why a device could not be read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeviceError {
    /// Not `kind` or `kind:index` with a decimal index.
    Malformed {
        /// What was written.
        text: String,
    },
    /// A kind torch does not name.
    UnknownKind {
        /// What was written.
        text: String,
        /// The kind part of it.
        kind: String,
    },
    /// A device spelled otherwise than torch spells it, though it reads as one: a leading
    /// zero or a sign in the index (`cuda:01`, `cuda:+1`), a space (`cuda: 1`), capitals
    /// (`CUDA:1`). Refused rather than read: torch refuses these spellings, and one device
    /// must have one spelling, or two placements of it would not look alike.
    Misspelled {
        /// What was written.
        text: String,
        /// The device it would be, as torch spells it.
        canonical: Device,
    },
    /// A kind whose devices must be told apart, without an index (`cuda`).
    NeedsIndex {
        /// What was written.
        text: String,
        /// Its kind.
        kind: DeviceKind,
    },
}

impl fmt::Display for DeviceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceError::Malformed { text } => write!(
                f,
                "`{text}` is not a device\nhint: write a device as torch does: `cpu`, `cuda:0`, `meta`, `mps`, `xpu:1`"
            ),
            DeviceError::UnknownKind { text, kind } => {
                let known = DeviceKind::ALL.map(DeviceKind::name).join("`, `");
                write!(
                    f,
                    "`{text}` is not a device: `{kind}` is no kind of device\nhint: the kinds are `{known}`"
                )
            }
            DeviceError::Misspelled { text, canonical } => write!(
                f,
                "`{text}` is not how a device is written: torch writes it `{canonical}`\nhint: write `{canonical}`: a kind in lowercase, then `:` and the index in decimal digits without a leading zero, no spaces"
            ),
            DeviceError::NeedsIndex { text, kind } => write!(
                f,
                "`{text}` does not say which {kind} device\nhint: write `{kind}:0`, `{kind}:1`, …: a bare `{kind}` means the thread's current device, and a branch runs on a thread lent to it",
                kind = kind.name()
            ),
        }
    }
}

impl std::error::Error for DeviceError {}

impl FromStr for Device {
    type Err = DeviceError;

    /// Reads `kind` or `kind:index`, as torch spells them.
    fn from_str(text: &str) -> Result<Device, DeviceError> {
        match strictly(text) {
            Ok(device) => Ok(device),
            Err(error @ (DeviceError::UnknownKind { .. } | DeviceError::NeedsIndex { .. })) => {
                Err(error)
            }
            Err(error @ (DeviceError::Malformed { .. } | DeviceError::Misspelled { .. })) => {
                match loosely(text) {
                    Some(canonical) => Err(DeviceError::Misspelled {
                        text: text.to_owned(),
                        canonical,
                    }),
                    None => Err(error),
                }
            }
        }
    }
}

/// `kind` or `kind:index` exactly as torch spells them: a lowercase kind, and an index of
/// decimal digits without a leading zero.
fn strictly(text: &str) -> Result<Device, DeviceError> {
    let malformed = || DeviceError::Malformed {
        text: text.to_owned(),
    };
    let (kind, index) = match text.split_once(':') {
        Some((kind, index)) => {
            // Decimal digits only: `u32::from_str` would take a sign, and a leading zero.
            if index.is_empty()
                || !index.bytes().all(|b| b.is_ascii_digit())
                || (index.len() > 1 && index.starts_with('0'))
            {
                return Err(malformed());
            }
            (kind, Some(index.parse::<u32>().map_err(|_| malformed())?))
        }
        None => (text, None),
    };
    if kind.is_empty() || !kind.bytes().all(|b| b.is_ascii_lowercase()) {
        return Err(malformed());
    }
    let Some(&kind) = DeviceKind::ALL.iter().find(|k| k.name() == kind) else {
        return Err(DeviceError::UnknownKind {
            text: text.to_owned(),
            kind: kind.to_owned(),
        });
    };
    Device::new(kind, index).map_err(|_| DeviceError::NeedsIndex {
        text: text.to_owned(),
        kind,
    })
}

/// The device a spelling torch refuses was surely meant to be, if one: spaces, capitals, a
/// sign or leading zeros set aside. Only ever the hint of an error, never a placement.
fn loosely(text: &str) -> Option<Device> {
    let text = text.trim().to_ascii_lowercase();
    let (kind, index) = match text.split_once(':') {
        Some((kind, index)) => {
            let index = index.trim();
            let digits = index.strip_prefix('+').unwrap_or(index);
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            (kind.trim(), Some(digits.parse::<u32>().ok()?))
        }
        None => (text.as_str(), None),
    };
    let kind = *DeviceKind::ALL.iter().find(|k| k.name() == kind)?;
    Device::new(kind, index).ok()
}

/// Which node runs on which device: nodes not named here are unplaced.
///
/// Kept beside a graph, never in it: placing a node changes neither the graph nor its plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    devices: HashMap<NodeId, Device>,
}

impl Placement {
    /// No node placed.
    pub fn new() -> Self {
        Placement::default()
    }

    /// Places `node` on `device`, replacing where it was; returns where that was.
    pub fn place(&mut self, node: impl Into<NodeId>, device: Device) -> Option<Device> {
        self.devices.insert(node.into(), device)
    }

    /// Places `inner`'s nodes as `inner` does, each under `prefix` as [`crate::Graph::embed`]
    /// names it (`prefix/x`): the nodes of what a decision step runs, where they were placed.
    pub fn embed(&mut self, prefix: &str, inner: &Placement) {
        for (node, device) in inner.iter() {
            self.place(NodeId::inside(prefix, node.as_str()), device);
        }
    }

    /// Unplaces `node`; returns where it was.
    pub fn remove(&mut self, node: &str) -> Option<Device> {
        self.devices.remove(node)
    }

    /// The device `node` is placed on, if any.
    pub fn device(&self, node: &str) -> Option<Device> {
        self.devices.get(node).copied()
    }

    /// Every placed node and its device, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&NodeId, Device)> {
        self.devices.iter().map(|(node, device)| (node, *device))
    }

    /// How many nodes are placed.
    pub fn len(&self) -> usize {
        self.devices.len()
    }

    /// Whether no node is placed.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }
}

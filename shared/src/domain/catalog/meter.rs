//! What a metered price counts: its [`Unit`], the [`Quantity`] an executor
//! measures, and the [`Meter`] that turns what a run used into a charge.
//!
//! A file of its own, below the rest of the catalog: each executor says what
//! it measures in terms of these, and the catalog's [`TaskSpec`](super::TaskSpec)
//! holds the executors, so the executors must not need the catalog's own
//! module to say it.

/// A metered price's rate: so many atomic units of the asset per `unit`
/// the task used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meter {
    pub unit: Unit,
    /// Atomic units of the asset per unit used.
    pub rate: u128,
    /// The USD rate as written, kept for display only.
    pub rate_usd: Option<String>,
}

impl Meter {
    /// What `used` (in the unit's base: bytes, or milliseconds) costs, capped
    /// at `ceiling`: rounded up to the next atomic unit, so a fraction of one
    /// unit of the asset is the most a rounding ever adds.
    pub fn charge(&self, used: u64, ceiling: u128) -> u128 {
        let per = self.unit.base();
        let scaled = u128::from(used).saturating_mul(self.rate);
        scaled.div_ceil(u128::from(per)).min(ceiling)
    }
}

/// What a metered price counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Byte,
    KiB,
    MiB,
    GiB,
    /// Seconds a run took, counted in milliseconds.
    Second,
    /// A unit a kind's service names and counts itself (`unit = "token"`,
    /// `"page"`): what its `usage` reports say, one for one. Only a kind
    /// whose service reports (the executor protocol) may be priced in one.
    Reported(&'static str),
}

impl Unit {
    pub const ALL: [Unit; 5] = [Unit::Byte, Unit::KiB, Unit::MiB, Unit::GiB, Unit::Second];

    /// The name `unit` takes in `reeve.toml`, and in the catalog view.
    pub fn name(self) -> &'static str {
        match self {
            Unit::Byte => "byte",
            Unit::KiB => "KiB",
            Unit::MiB => "MiB",
            Unit::GiB => "GiB",
            Unit::Second => "second",
            Unit::Reported(name) => name,
        }
    }

    /// One of [`Unit::ALL`] by its name, or else a service's own unit
    /// (`[a-z_]{1,32}`).
    pub fn parse(name: &str) -> Option<Self> {
        Unit::ALL.into_iter().find(|u| u.name() == name).or_else(|| {
            let valid =
                (1..=MAX_UNIT_CHARS).contains(&name.len()) && name.chars().all(|c| c.is_ascii_lowercase() || c == '_');
            valid.then(|| Unit::Reported(intern(name)))
        })
    }

    /// How many of what an executor measures (bytes, or milliseconds) make
    /// one unit.
    pub fn base(self) -> u64 {
        match self {
            Unit::Byte => 1,
            Unit::KiB => 1 << 10,
            Unit::MiB => 1 << 20,
            Unit::GiB => 1 << 30,
            Unit::Second => 1000,
            Unit::Reported(_) => 1,
        }
    }

    /// What the unit counts: an executor priced in it must measure the same
    /// quantity ([`Executor::meters`](crate::domain::executors::Executor::meters)).
    pub fn quantity(self) -> Quantity {
        match self {
            Unit::Byte | Unit::KiB | Unit::MiB | Unit::GiB => Quantity::Bytes,
            Unit::Second => Quantity::Milliseconds,
            Unit::Reported(_) => Quantity::Reported,
        }
    }
}

/// What an executor counts for a metered price: the quantity a finished
/// run's usage is given in, and so which units it can be priced in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quantity {
    /// Bytes: priced per `byte`, `KiB`, `MiB` or `GiB`.
    Bytes,
    /// Milliseconds of run time: priced per `second`.
    Milliseconds,
    /// What a service reports in a unit of its own naming.
    Reported,
}

/// The longest name of a service's own unit.
pub const MAX_UNIT_CHARS: usize = 32;

/// The one `&'static` copy of a service unit's name: the catalog names few,
/// and every load of it names the same ones, so what is kept is bounded by
/// the distinct names ever read (each at most [`MAX_UNIT_CHARS`]).
fn intern(name: &str) -> &'static str {
    static NAMES: std::sync::Mutex<Vec<&'static str>> = std::sync::Mutex::new(Vec::new());
    let mut names = NAMES.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(known) = names.iter().find(|n| **n == name) {
        return known;
    }
    let leaked: &'static str = Box::leak(name.to_owned().into_boxed_str());
    names.push(leaked);
    leaked
}

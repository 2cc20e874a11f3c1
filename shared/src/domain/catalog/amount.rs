//! Prices. Atomic amounts can exceed 2^53 and USD prices must convert without
//! rounding surprises, so everything here is decimal strings and `u128`,
//! never floats.

/// The most fractional digits an `amount_usd` may have. 18 covers the
/// smallest unit of any common token, and bounds the arithmetic.
const MAX_USD_FRACTION_DIGITS: usize = 18;

/// An `amount`: a positive whole number of the asset's smallest unit.
pub fn atomic(amount: &str) -> Result<u128, String> {
    if amount.is_empty() || !amount.chars().all(|c| c.is_ascii_digit()) {
        return Err(format!("{amount:?} is not a whole number of atomic units (digits only, e.g. \"10000\")"));
    }
    match amount.parse::<u128>() {
        Ok(0) => Err("must be greater than 0".to_owned()),
        Ok(atomic) => Ok(atomic),
        Err(_) => Err(format!("{amount:?} is too large")),
    }
}

/// A syntactically valid `amount_usd`, split at the decimal point.
pub struct Usd<'a> {
    written: &'a str,
    whole: &'a str,
    fraction: &'a str,
}

/// Accepts `digits[.digits]` only: no sign, exponent, separators or bare
/// point, so what the operator wrote is exactly what gets charged.
pub fn usd(amount: &str) -> Result<Usd<'_>, String> {
    let (whole, fraction) = amount.split_once('.').unwrap_or((amount, ""));
    let digits = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_digit());
    if !digits(whole) || (amount.contains('.') && !digits(fraction)) {
        return Err(format!("{amount:?} is not a decimal amount of US dollars (e.g. \"0.01\"; no sign or exponent)"));
    }
    if fraction.len() > MAX_USD_FRACTION_DIGITS {
        return Err(format!("{amount:?} has more than {MAX_USD_FRACTION_DIGITS} fractional digits"));
    }
    Ok(Usd { written: amount, whole, fraction })
}

impl Usd<'_> {
    /// `floor(usd × 10^decimals)` for a 1:1 USD-pegged asset. Truncating the
    /// fraction to `decimals` digits is exactly the floor. Zero is a valid
    /// result here; whether it is acceptable is the caller's rule.
    pub fn to_atomic(&self, decimals: u8) -> Result<u128, String> {
        let too_large = || format!("{:?} is too large for an asset with {decimals} decimals", self.written);
        let width = usize::from(decimals);
        let kept = &self.fraction[..self.fraction.len().min(width)];
        let fraction = format!("{kept:0<width$}");
        let scale = 10u128.checked_pow(u32::from(decimals)).ok_or_else(too_large)?;
        let whole: u128 = self.whole.parse().map_err(|_| too_large())?;
        let fraction: u128 = if fraction.is_empty() { 0 } else { fraction.parse().map_err(|_| too_large())? };
        whole.checked_mul(scale).and_then(|whole| whole.checked_add(fraction)).ok_or_else(too_large)
    }
}

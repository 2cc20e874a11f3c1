//! `reeve payments channels`: the batch-settlement channels as the sweeper
//! sees them, over `DATABASE_URL` (an operator's view, as `reeve migrate`
//! reaches the database): what each channel's vouchers bought, what the
//! escrow showed claimed, and when the rest is claimed or the payer can
//! withdraw it (see `reeve_shared::payments::batch::claim::channels`).

use clap::{Args, Subcommand};
use reeve_shared::db;
use reeve_shared::payments::batch::claim::{self, ChannelState};
use reeve_shared::settings::{self, Config};
use reeve_shared::{startup, telemetry};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

#[derive(Subcommand)]
pub enum PaymentsCommand {
    /// The batch-settlement channels with vouchers not yet claimed, the
    /// soonest claim first: what each bought, what is claimed, when the rest
    /// is claimed, and from when its payer could withdraw it.
    Channels(ChannelsArgs),
    /// A payer's side: take back at once what your batch-settlement channel
    /// to a deployment holds beyond what was charged (a cooperative refund,
    /// signed with REEVE_WALLET_KEY; the channel `task create --pay
    /// --channel` pays on).
    Refund(Box<crate::client::refund::RefundArgs>),
}

#[derive(Args)]
pub struct ChannelsArgs {
    /// Every channel, also those claimed in full.
    #[arg(long)]
    all: bool,
    /// How many channels at most.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(i64).range(1..=10_000))]
    limit: i64,
    /// One JSON array, amounts as decimal strings in the token's smallest
    /// units.
    #[arg(long)]
    json: bool,
}

/// `reeve payments channels`: the operator's view.
pub async fn channels(args: ChannelsArgs) -> anyhow::Result<()> {
    telemetry::init();
    let config = Config::from_env();
    // The claim policy the sweeper runs with, to say when a claim is due.
    let mut env = config.env();
    let after = settings::batch_claim_after(&mut env);
    let problems = env.take_problems();
    if !problems.is_empty() {
        anyhow::bail!("bad environment: {}", problems.join("; "));
    }
    let url = startup::database_url(&config, &startup::sdk().await).await?;
    let pool = db::connect(url.expose_str()).await?;
    let channels = claim::channels(&pool, after, args.all, args.limit).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&channels)?);
        return Ok(());
    }
    if channels.is_empty() {
        println!("{}", if args.all { "no batch-settlement channel" } else { "no voucher waits to be claimed" });
        return Ok(());
    }
    let now = OffsetDateTime::now_utc();
    for channel in &channels {
        print!("{}", describe(channel, now));
    }
    Ok(())
}

/// A channel in a few lines, its times as RFC 3339.
fn describe(c: &ChannelState, now: OffsetDateTime) -> String {
    let at = |t: &Option<OffsetDateTime>| t.and_then(|t| t.format(&Rfc3339).ok()).unwrap_or_else(|| "-".into());
    let due = match c.claim_due_at {
        None => "nothing to claim".to_owned(),
        Some(t) if t <= now => "at the next sweep".to_owned(),
        Some(_) => at(&c.claim_due_at),
    };
    let mut text = format!(
        "{}  {}\n  payer {}  pays to {}  asset {}\n  charged {}  claimed {}  unclaimed {}  escrow balance {} (read {})\n  oldest unclaimed voucher {}  claim due {}\n",
        c.channel_id,
        c.network,
        c.payer,
        c.pay_to.as_deref().unwrap_or("-"),
        c.asset.as_deref().unwrap_or("-"),
        c.charged,
        c.claimed,
        c.unclaimed,
        c.balance,
        at(&Some(c.read_at)),
        at(&c.oldest_unclaimed_at),
        due,
    );
    if c.refunds > 0 {
        text += &format!(
            "  refunded {} to the payer in {} refund(s), the last {}\n",
            c.refunded,
            c.refunds,
            at(&c.last_refund_at)
        );
    }
    if c.written_off != "0" {
        text += &format!("  written off {}: the payer withdrew it before a claim landed\n", c.written_off);
    }
    if c.withdraw_requested_at.is_some() {
        text += &format!(
            "  withdrawal asked {}: what is unclaimed is the payer's from {}\n",
            at(&c.withdraw_requested_at),
            at(&c.withdrawable_at)
        );
    }
    text
}

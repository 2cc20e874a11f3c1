//! [`Shelf`]: where payments put what they sold. `payments` never names a
//! task; it stores one through its `Counter` trait, which this implements
//! with the task store's own insert, for task create and for the
//! reconciler that creates the task of a payment that landed late.

use sqlx::PgConnection;

use super::{EventType, Task, TaskRequest, append_event, insert_queued};
use crate::domain::auth::SpaceIndex;
use crate::domain::catalog::Catalog;
use crate::domain::ids::Id;
use crate::domain::payments::{Counter, MeteredPayment, Metering, Note};

/// Where payments store what they sold: a queued task, with the event that
/// says how it was paid. The reconciler stores through it too.
pub struct Shelf<'a> {
    pub catalog: &'a Catalog,
}

impl Counter for Shelf<'_> {
    type Task = Task;

    fn task_id(task: &Task) -> Id {
        task.id
    }

    fn offers(&self, kind: &str) -> bool {
        self.catalog.task(kind).is_some()
    }

    async fn store(&self, conn: &mut PgConnection, request: &TaskRequest<'_>) -> Result<Option<Task>, sqlx::Error> {
        insert_queued(conn, *request).await
    }

    fn metering(&self, kind: &str, asset: &str) -> Option<Metering> {
        let task = self.catalog.task(kind)?;
        task.accepts.iter().find_map(|price| {
            let meter = price.meter.as_ref()?;
            let contract = &self.catalog.assets.get(&price.asset)?.contract;
            contract.eq_ignore_ascii_case(asset).then_some(Metering {
                timeout_seconds: task.timeout_seconds,
                unit: meter.unit.name(),
                rate: meter.rate,
            })
        })
    }

    async fn authorized(
        &self,
        conn: &mut PgConnection,
        task: Task,
        payment: &MeteredPayment,
    ) -> Result<Task, sqlx::Error> {
        let sql = concat!("UPDATE tasks SET payment = $2 WHERE id = $1 RETURNING ", task_columns!());
        sqlx::query_as(sql).bind(task.id).bind(sqlx::types::Json(payment)).fetch_one(conn).await
    }

    async fn key_taken(&self, conn: &mut PgConnection, space: &SpaceIndex, key: &str) -> Result<bool, sqlx::Error> {
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM tasks WHERE space_idx = $1 AND idempotency_key = $2)")
            .bind(space.as_bytes())
            .bind(key)
            .fetch_one(conn)
            .await
    }

    async fn note(&self, conn: &mut PgConnection, task: &Task, note: &Note<'_>) -> Result<(), sqlx::Error> {
        let kind = match note {
            Note::Credit(_) => EventType::CreditUsed,
            Note::SettledLate { .. } => EventType::PaymentSettledLate,
        };
        append_event(conn, task.id, kind, &note.data()).await.map(|_| ())
    }
}

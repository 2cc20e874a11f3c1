//! A space's tasks, newest first, a page at a time. The cursor is the last
//! id of the previous page: ULIDs sort by creation time, so "older than the
//! cursor" is `id < after`, stable however many tasks are created meanwhile.

use sqlx::PgPool;

use super::{Task, TaskStatus};
use crate::domain::auth::SpaceIndex;
use crate::domain::ids::Id;

pub const DEFAULT_LIMIT: u32 = 20;
pub const MAX_LIMIT: u32 = 100;

/// What to list; `None` filters match everything.
#[derive(Debug, Clone, Copy)]
pub struct ListQuery<'a> {
    pub status: Option<TaskStatus>,
    pub kind: Option<&'a str>,
    /// Only tasks older than this one (the previous page's `next`).
    pub after: Option<Id>,
    /// 1..=[`MAX_LIMIT`]; clamped.
    pub limit: u32,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    pub tasks: Vec<Task>,
    /// The cursor for the next page; `None` on the last one.
    pub next: Option<Id>,
}

pub async fn list(db: &PgPool, space: &SpaceIndex, query: ListQuery<'_>) -> Result<Page, sqlx::Error> {
    let limit = query.limit.clamp(1, MAX_LIMIT);
    let sql = concat!(
        "SELECT ",
        task_columns!(),
        " FROM tasks
          WHERE space_idx = $1
            AND ($2::bytea IS NULL OR id < $2)
            AND ($3::text IS NULL OR status = $3)
            AND ($4::text IS NULL OR kind = $4)
          ORDER BY id DESC
          LIMIT $5"
    );
    // One row more than asked tells whether there is a next page.
    let mut tasks: Vec<Task> = sqlx::query_as(sql)
        .bind(space.as_bytes())
        .bind(query.after)
        .bind(query.status.map(TaskStatus::as_str))
        .bind(query.kind)
        .bind(i64::from(limit) + 1)
        .fetch_all(db)
        .await?;
    let next = if tasks.len() > limit as usize {
        tasks.truncate(limit as usize);
        tasks.last().map(|t| t.id)
    } else {
        None
    };
    Ok(Page { tasks, next })
}

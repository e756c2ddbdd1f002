//! The do-it-yourself live query on PostgreSQL: a row trigger calls `pg_notify` on every
//! change, and a listener connection (`LISTEN`) re-runs the view's query on each
//! notification. Latency: the write sent → the re-query's last row received.

use std::time::{Duration, Instant};

use anyhow::Context;
use futures_util::StreamExt;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tokio_postgres::AsyncMessage;

use crate::peers::postgres::Postgres;

/// The channel every bench trigger notifies on.
pub const CHANNEL: &str = "sluice_bench_live";

/// `CREATE FUNCTION` + `CREATE TRIGGER` for `table`: `AFTER INSERT OR UPDATE OR DELETE …
/// FOR EACH ROW`, notifying with the value of `token_column` (the bench writes a fresh value
/// each time, so a notification names its write).
pub fn trigger_sql(table: &str, token_column: &str) -> String {
    format!(
        "CREATE OR REPLACE FUNCTION {table}_notify() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           IF TG_OP = 'DELETE' THEN
             PERFORM pg_notify('{CHANNEL}', OLD.{token_column}::text);
           ELSE
             PERFORM pg_notify('{CHANNEL}', NEW.{token_column}::text);
           END IF;
           RETURN NULL;
         END $$;
         DROP TRIGGER IF EXISTS {table}_notify ON {table};
         CREATE TRIGGER {table}_notify AFTER INSERT OR UPDATE OR DELETE ON {table}
           FOR EACH ROW EXECUTE FUNCTION {table}_notify();"
    )
}

/// One re-query done after a notification.
#[derive(Debug)]
pub struct Requeried {
    pub payload: String,
    pub rows: usize,
    pub at: Instant,
}

/// A listener connection re-running `sql` on every notification on [`CHANNEL`].
pub struct Listener {
    pub results: mpsc::UnboundedReceiver<anyhow::Result<Requeried>>,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
    driver: JoinHandle<()>,
}

impl Listener {
    pub async fn start(pg: &Postgres, sql: &str) -> anyhow::Result<Listener> {
        let (client, mut connection) =
            tokio_postgres::connect(&pg.conn_string(), tokio_postgres::NoTls)
                .await
                .context("cannot connect the listener to postgres")?;
        let (notify_tx, mut notify_rx) = mpsc::unbounded_channel();
        // Drives the connection (query replies too) and forwards notifications.
        let driver = tokio::spawn(async move {
            let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(m) = messages.next().await {
                match m {
                    Ok(AsyncMessage::Notification(n)) => {
                        if notify_tx
                            .send((n.payload().to_string(), Instant::now()))
                            .is_err()
                        {
                            break;
                        }
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
        });
        client
            .batch_execute(&format!("LISTEN {CHANNEL}"))
            .await
            .context("LISTEN")?;
        let statement = client.prepare(sql).await.context("preparing the view")?;
        let (tx, results) = mpsc::unbounded_channel();
        let (stop, mut stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            loop {
                let payload = tokio::select! {
                    _ = &mut stopped => break,
                    n = notify_rx.recv() => match n {
                        Some((payload, _)) => payload,
                        None => break,
                    },
                };
                let result = client
                    .query(&statement, &[])
                    .await
                    .map(|rows| Requeried {
                        payload,
                        rows: rows.len(),
                        at: Instant::now(),
                    })
                    .map_err(anyhow::Error::from);
                if tx.send(result).is_err() {
                    break;
                }
            }
        });
        Ok(Listener {
            results,
            stop: Some(stop),
            task,
            driver,
        })
    }

    /// Waits for the re-query that followed the notification carrying `payload`.
    pub async fn wait_for(
        &mut self,
        payload: &str,
        timeout: Duration,
    ) -> anyhow::Result<Option<Requeried>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.results.recv()).await {
                Err(_) => return Ok(None),
                Ok(None) => anyhow::bail!("the PostgreSQL listener stopped"),
                Ok(Some(r)) => {
                    let r = r?;
                    if r.payload == payload {
                        return Ok(Some(r));
                    }
                }
            }
        }
    }

    pub async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
        self.driver.abort();
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
        self.driver.abort();
    }
}

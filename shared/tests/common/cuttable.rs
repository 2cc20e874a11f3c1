//! [`Cuttable`]: a TCP proxy a test cuts to take one service away from
//! its own app.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A TCP proxy to one of the stack's services that a test can cut: "Postgres
/// stopped", "KMS out of reach", for that test's app only, without stopping
/// the service others use.
pub struct Cuttable {
    pub port: u16,
    up: Arc<AtomicBool>,
    links: Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl Cuttable {
    pub async fn to(target: (String, u16)) -> Cuttable {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let up = Arc::new(AtomicBool::new(true));
        let links: Arc<std::sync::Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let (up2, links2) = (up.clone(), links.clone());
        tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else { return };
                if !up2.load(Ordering::SeqCst) {
                    continue; // dropped: connection refused, in effect
                }
                let target = target.clone();
                let link = tokio::spawn(async move {
                    if let Ok(mut server) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                    }
                });
                links2.lock().unwrap().push(link.abort_handle());
            }
        });
        Cuttable { port, up, links }
    }

    pub fn cut(&self) {
        self.up.store(false, Ordering::SeqCst);
        for link in self.links.lock().unwrap().drain(..) {
            link.abort();
        }
    }

    pub fn restore(&self) {
        self.up.store(true, Ordering::SeqCst);
    }
}

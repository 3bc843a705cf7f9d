//! Serving one device on a vhost-user Unix socket: bind first (so a front end started right
//! after finds the socket), then serve one front-end connection at a time.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use vhost::vhost_user::Listener;
use vhost_user_backend::VhostUserDaemon;
use vm_memory::{GuestMemoryAtomic, GuestMemoryMmap};
use vmm_sys_util::epoll::EventSet;

use crate::backend::Backend;
use crate::device::ServedDevice;

/// Why serving failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The socket could not be created.
    #[error("cannot listen on vhost-user socket {path}: {source} (is the directory writable, the path under 108 bytes?)")]
    Bind {
        /// The socket path given.
        path: PathBuf,
        /// What the library said.
        source: vhost::vhost_user::Error,
    },
    /// The vhost-user session failed (accepting, or a protocol error from the front end).
    #[error("vhost-user session on {path}: {message}")]
    Session {
        /// The socket path.
        path: PathBuf,
        /// What the library said.
        message: String,
    },
    /// The device's host-side descriptor could not be polled.
    #[error("cannot poll the {device} device's host side: {source}")]
    HostEvents {
        /// Which device.
        device: &'static str,
        /// The epoll error.
        source: std::io::Error,
    },
}

/// A bound vhost-user socket.
pub struct VhostServer {
    listener: Listener,
    path: PathBuf,
}

impl VhostServer {
    /// Binds `path`, replacing a stale socket file left there.
    pub fn bind(path: &Path) -> Result<Self, ServeError> {
        let listener =
            Listener::new(path, true).map_err(|source| ServeError::Bind { path: path.to_owned(), source })?;
        Ok(VhostServer { listener, path: path.to_owned() })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Accepts one front end and serves `backend` to it until it disconnects (a guest power-off
    /// or a killed QEMU both end here normally).
    pub fn serve<D: ServedDevice>(&mut self, backend: Backend<D>) -> Result<(), ServeError> {
        let name = format!("vhost-{}", backend.device_name());
        let host = backend.host_event_fd().map(|fd| (fd, backend.host_event_id(), backend.device_name()));
        let mem = GuestMemoryAtomic::new(GuestMemoryMmap::new());
        let mut daemon =
            VhostUserDaemon::new(name, Arc::new(RwLock::new(backend)), mem).map_err(|e| self.session(e))?;
        daemon.start(&mut self.listener).map_err(|e| self.session(e))?;
        let handlers = daemon.get_epoll_handlers();
        if let Some((fd, id, device)) = host {
            // All queues share the library's one worker thread (the default); its epoll
            // also watches the host side.
            if let Some(handler) = handlers.first() {
                handler
                    .register_listener(fd, EventSet::IN, u64::from(id))
                    .map_err(|source| ServeError::HostEvents { device, source })?;
            }
        }
        let result = daemon.wait();
        for handler in &handlers {
            handler.send_exit_event();
        }
        match result {
            Ok(()) => Ok(()),
            // A front end that goes away between messages is a normal end of a session.
            Err(vhost_user_backend::Error::HandleRequest(
                vhost::vhost_user::Error::Disconnected | vhost::vhost_user::Error::PartialMessage,
            )) => Ok(()),
            Err(e) => Err(self.session(e)),
        }
    }

    fn session(&self, e: vhost_user_backend::Error) -> ServeError {
        ServeError::Session { path: self.path.clone(), message: e.to_string() }
    }
}

//! Who made a request, as the token gate ([`crate::auth`]) and the console's sessions
//! ([`crate::ui::session`]) both name it; below both, so neither imports the other for it.

/// Who made a request: the id of the token it carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller(pub String);

//! The messages of envd's `process` and `filesystem` services that branchboxd serves, written
//! by hand from the field numbers and types of E2B's published `.proto` files (no build step).
//! Each derives `prost::Message` for the binary codec and serde for the proto3 JSON mapping
//! (camelCase names, bytes as base64, 64-bit integers as strings, enums by name, oneofs as
//! one member of the enclosing object), which is what E2B's SDKs send by default.
//!
//! Only what the served methods read or write is here; unknown fields are ignored on input,
//! as protobuf parsers do.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::HashMap;

/// Base64 (standard alphabet, padded; URL-safe accepted) for `bytes` fields.
mod b64 {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        let e = &base64::engine::general_purpose::STANDARD;
        let url = &base64::engine::general_purpose::URL_SAFE;
        let trimmed = text.trim_end_matches('=');
        base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(trimmed)
            .or_else(|_| base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(trimmed))
            .or_else(|_| e.decode(&text))
            .or_else(|_| url.decode(&text))
            .map_err(serde::de::Error::custom)
    }
}

/// A proto3 JSON integer: a number or a decimal string.
fn lenient_u32<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum N {
        Num(u32),
        Text(String),
    }
    match Option::<N>::deserialize(d)? {
        None => Ok(0),
        Some(N::Num(n)) => Ok(n),
        Some(N::Text(t)) => t.parse().map_err(serde::de::Error::custom),
    }
}

fn i64_as_string<S: Serializer>(v: &i64, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&v.to_string())
}

/// `process.PTY`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Pty {
    #[prost(message, optional, tag = "1")]
    pub size: Option<PtySize>,
}

/// `process.PTY.Size`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PtySize {
    #[prost(uint32, tag = "1")]
    #[serde(deserialize_with = "lenient_u32")]
    pub cols: u32,
    #[prost(uint32, tag = "2")]
    #[serde(deserialize_with = "lenient_u32")]
    pub rows: u32,
}

/// `process.ProcessConfig`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProcessConfig {
    #[prost(string, tag = "1")]
    pub cmd: String,
    #[prost(string, repeated, tag = "2")]
    pub args: Vec<String>,
    #[prost(map = "string, string", tag = "3")]
    pub envs: HashMap<String, String>,
    #[prost(string, optional, tag = "4")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

/// `process.ListRequest`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct ListRequest {}

/// `process.ProcessInfo`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ProcessInfo {
    #[prost(message, optional, tag = "1")]
    pub config: Option<ProcessConfig>,
    #[prost(uint32, tag = "2")]
    pub pid: u32,
    #[prost(string, optional, tag = "3")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

/// `process.ListResponse`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ListResponse {
    #[prost(message, repeated, tag = "1")]
    pub processes: Vec<ProcessInfo>,
}

/// `process.StartRequest`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct StartRequest {
    #[prost(message, optional, tag = "1")]
    pub process: Option<ProcessConfig>,
    #[prost(message, optional, tag = "2")]
    pub pty: Option<Pty>,
    #[prost(string, optional, tag = "3")]
    pub tag: Option<String>,
    #[prost(bool, optional, tag = "4")]
    pub stdin: Option<bool>,
}

/// `process.ProcessEvent`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct ProcessEvent {
    #[prost(oneof = "process_event::Event", tags = "1, 2, 3, 4")]
    #[serde(flatten)]
    pub event: Option<process_event::Event>,
}

/// The members of `process.ProcessEvent`.
pub mod process_event {
    use super::b64;
    use serde::{Deserialize, Serialize};

    /// The `event` oneof.
    #[derive(Clone, PartialEq, prost::Oneof, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub enum Event {
        #[prost(message, tag = "1")]
        Start(StartEvent),
        #[prost(message, tag = "2")]
        Data(DataEvent),
        #[prost(message, tag = "3")]
        End(EndEvent),
        #[prost(message, tag = "4")]
        Keepalive(KeepAlive),
    }

    /// `process.ProcessEvent.StartEvent`.
    #[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase", default)]
    pub struct StartEvent {
        #[prost(uint32, tag = "1")]
        pub pid: u32,
    }

    /// `process.ProcessEvent.DataEvent`.
    #[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
    #[serde(default)]
    pub struct DataEvent {
        #[prost(oneof = "Output", tags = "1, 2, 3")]
        #[serde(flatten)]
        pub output: Option<Output>,
    }

    /// The `output` oneof of a data event.
    #[derive(Clone, PartialEq, prost::Oneof, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub enum Output {
        #[prost(bytes, tag = "1")]
        Stdout(#[serde(with = "b64")] Vec<u8>),
        #[prost(bytes, tag = "2")]
        Stderr(#[serde(with = "b64")] Vec<u8>),
        #[prost(bytes, tag = "3")]
        Pty(#[serde(with = "b64")] Vec<u8>),
    }

    /// `process.ProcessEvent.EndEvent`.
    #[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase", default)]
    pub struct EndEvent {
        #[prost(sint32, tag = "1")]
        pub exit_code: i32,
        #[prost(bool, tag = "2")]
        pub exited: bool,
        #[prost(string, tag = "3")]
        pub status: String,
        #[prost(string, optional, tag = "4")]
        #[serde(skip_serializing_if = "Option::is_none")]
        pub error: Option<String>,
    }

    /// `process.ProcessEvent.KeepAlive`.
    #[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
    pub struct KeepAlive {}
}

/// `process.StartResponse` (and `process.ConnectResponse`, which has the same shape).
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct StartResponse {
    #[prost(message, optional, tag = "1")]
    pub event: Option<ProcessEvent>,
}

/// `process.ProcessSelector`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct ProcessSelector {
    #[prost(oneof = "process_selector::Selector", tags = "1, 2")]
    #[serde(flatten)]
    pub selector: Option<process_selector::Selector>,
}

/// The members of `process.ProcessSelector`.
pub mod process_selector {
    use serde::{Deserialize, Serialize};

    /// The `selector` oneof.
    #[derive(Clone, PartialEq, prost::Oneof, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub enum Selector {
        #[prost(uint32, tag = "1")]
        Pid(#[serde(deserialize_with = "super::lenient_u32")] u32),
        #[prost(string, tag = "2")]
        Tag(String),
    }
}

/// `process.Signal`.
pub const SIGNAL_SIGTERM: i32 = 15;
/// `process.Signal`.
pub const SIGNAL_SIGKILL: i32 = 9;

/// A `process.Signal` field in JSON: its name or its number.
fn signal_enum<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum V {
        Num(i32),
        Name(String),
    }
    Ok(match Option::<V>::deserialize(d)? {
        None => 0,
        Some(V::Num(n)) => n,
        Some(V::Name(n)) => match n.as_str() {
            "SIGNAL_SIGTERM" => SIGNAL_SIGTERM,
            "SIGNAL_SIGKILL" => SIGNAL_SIGKILL,
            "SIGNAL_UNSPECIFIED" => 0,
            other => return Err(serde::de::Error::custom(format!("unknown signal {other:?}"))),
        },
    })
}

fn signal_name<S: Serializer>(v: &i32, s: S) -> Result<S::Ok, S::Error> {
    match *v {
        SIGNAL_SIGTERM => s.serialize_str("SIGNAL_SIGTERM"),
        SIGNAL_SIGKILL => s.serialize_str("SIGNAL_SIGKILL"),
        0 => s.serialize_str("SIGNAL_UNSPECIFIED"),
        n => s.serialize_i32(n),
    }
}

/// `process.SendSignalRequest`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SendSignalRequest {
    #[prost(message, optional, tag = "1")]
    pub process: Option<ProcessSelector>,
    #[prost(int32, tag = "2")]
    #[serde(deserialize_with = "signal_enum", serialize_with = "signal_name")]
    pub signal: i32,
}

/// An empty answer (`SendSignalResponse`, `RemoveResponse`, ...).
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
pub struct Empty {}

/// A request naming one path (`StatRequest`, `MakeDirRequest`, `RemoveRequest`).
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct PathRequest {
    #[prost(string, tag = "1")]
    pub path: String,
}

/// `filesystem.ListDirRequest`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ListDirRequest {
    #[prost(string, tag = "1")]
    pub path: String,
    #[prost(uint32, tag = "2")]
    #[serde(deserialize_with = "lenient_u32")]
    pub depth: u32,
}

/// `filesystem.MoveRequest`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct MoveRequest {
    #[prost(string, tag = "1")]
    pub source: String,
    #[prost(string, tag = "2")]
    pub destination: String,
}

/// `filesystem.FileType`.
pub const FILE_TYPE_UNSPECIFIED: i32 = 0;
/// `filesystem.FileType`.
pub const FILE_TYPE_FILE: i32 = 1;
/// `filesystem.FileType`.
pub const FILE_TYPE_DIRECTORY: i32 = 2;
/// `filesystem.FileType`.
pub const FILE_TYPE_SYMLINK: i32 = 3;

fn file_type_name<S: Serializer>(v: &i32, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(match *v {
        FILE_TYPE_FILE => "FILE_TYPE_FILE",
        FILE_TYPE_DIRECTORY => "FILE_TYPE_DIRECTORY",
        FILE_TYPE_SYMLINK => "FILE_TYPE_SYMLINK",
        _ => "FILE_TYPE_UNSPECIFIED",
    })
}

/// `google.protobuf.Timestamp`; in JSON an RFC 3339 string in UTC.
#[derive(Clone, PartialEq, prost::Message, Deserialize)]
pub struct Timestamp {
    #[prost(int64, tag = "1")]
    pub seconds: i64,
    #[prost(int32, tag = "2")]
    pub nanos: i32,
}

impl Timestamp {
    /// From nanoseconds since the Unix epoch.
    pub fn from_ns(ns: i64) -> Timestamp {
        Timestamp { seconds: ns.div_euclid(1_000_000_000), nanos: ns.rem_euclid(1_000_000_000) as i32 }
    }

    /// `YYYY-MM-DDTHH:MM:SS[.fffffffff]Z`.
    pub fn rfc3339(&self) -> String {
        let days = self.seconds.div_euclid(86_400);
        let secs = self.seconds.rem_euclid(86_400);
        // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
        let z = days + 719_468;
        let era = z.div_euclid(146_097);
        let doe = z.rem_euclid(146_097);
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
        let mp = (5 * doy + 2) / 153;
        let day = doy - (153 * mp + 2) / 5 + 1;
        let month = if mp < 10 { mp + 3 } else { mp - 9 };
        let year = yoe + era * 400 + i64::from(month <= 2);
        let frac = if self.nanos == 0 { String::new() } else { format!(".{:09}", self.nanos) };
        format!(
            "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}{frac}Z",
            secs / 3600,
            secs % 3600 / 60,
            secs % 60
        )
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.rfc3339())
    }
}

/// `filesystem.EntryInfo`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EntryInfo {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(int32, tag = "2")]
    #[serde(rename = "type", serialize_with = "file_type_name", skip_deserializing)]
    pub r#type: i32,
    #[prost(string, tag = "3")]
    pub path: String,
    #[prost(int64, tag = "4")]
    #[serde(serialize_with = "i64_as_string", skip_deserializing)]
    pub size: i64,
    #[prost(uint32, tag = "5")]
    pub mode: u32,
    #[prost(string, tag = "6")]
    pub permissions: String,
    #[prost(string, tag = "7")]
    pub owner: String,
    #[prost(string, tag = "8")]
    pub group: String,
    #[prost(message, optional, tag = "9")]
    #[serde(skip_serializing_if = "Option::is_none", skip_deserializing)]
    pub modified_time: Option<Timestamp>,
    #[prost(string, optional, tag = "10")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symlink_target: Option<String>,
    #[prost(map = "string, string", tag = "11")]
    pub metadata: HashMap<String, String>,
    #[prost(bool, tag = "12")]
    pub is_symlink: bool,
}

/// An answer carrying one entry (`StatResponse`, `MakeDirResponse`, `MoveResponse`).
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct EntryResponse {
    #[prost(message, optional, tag = "1")]
    pub entry: Option<EntryInfo>,
}

/// `filesystem.ListDirResponse`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ListDirResponse {
    #[prost(message, repeated, tag = "1")]
    pub entries: Vec<EntryInfo>,
}

/// `process.ProcessInput`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct ProcessInput {
    #[prost(oneof = "process_input::Input", tags = "1, 2")]
    #[serde(flatten)]
    pub input: Option<process_input::Input>,
}

/// The members of `process.ProcessInput`.
pub mod process_input {
    use super::b64;
    use serde::{Deserialize, Serialize};

    /// The `input` oneof: bytes for a process's stdin or typed into its terminal.
    #[derive(Clone, PartialEq, prost::Oneof, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub enum Input {
        #[prost(bytes, tag = "1")]
        Stdin(#[serde(with = "b64")] Vec<u8>),
        #[prost(bytes, tag = "2")]
        Pty(#[serde(with = "b64")] Vec<u8>),
    }
}

/// `process.SendInputRequest`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SendInputRequest {
    #[prost(message, optional, tag = "1")]
    pub process: Option<ProcessSelector>,
    #[prost(message, optional, tag = "2")]
    pub input: Option<ProcessInput>,
}

/// A request naming one process (`ConnectRequest`, `CloseStdinRequest`).
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct SelectRequest {
    #[prost(message, optional, tag = "1")]
    pub process: Option<ProcessSelector>,
}

/// `process.UpdateRequest`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct UpdateRequest {
    #[prost(message, optional, tag = "1")]
    pub process: Option<ProcessSelector>,
    #[prost(message, optional, tag = "2")]
    pub pty: Option<Pty>,
}

/// `process.StreamInputRequest`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct StreamInputRequest {
    #[prost(oneof = "stream_input::Event", tags = "1, 2, 3")]
    #[serde(flatten)]
    pub event: Option<stream_input::Event>,
}

/// The members of `process.StreamInputRequest`.
pub mod stream_input {
    use serde::{Deserialize, Serialize};

    /// The `event` oneof.
    #[derive(Clone, PartialEq, prost::Oneof, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub enum Event {
        #[prost(message, tag = "1")]
        Start(super::SelectRequest),
        #[prost(message, tag = "2")]
        Data(DataEvent),
        #[prost(message, tag = "3")]
        Keepalive(super::Empty),
    }

    /// `process.StreamInputRequest.DataEvent`.
    #[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase", default)]
    pub struct DataEvent {
        #[prost(message, optional, tag = "2")]
        pub input: Option<super::ProcessInput>,
    }
}

/// `filesystem.WatchDirRequest` and `filesystem.CreateWatcherRequest` (the same fields).
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct WatchRequest {
    #[prost(string, tag = "1")]
    pub path: String,
    #[prost(bool, tag = "2")]
    pub recursive: bool,
    #[prost(bool, tag = "3")]
    pub include_entry: bool,
    #[prost(bool, tag = "4")]
    pub allow_network_mounts: bool,
}

/// `filesystem.EventType`.
pub const EVENT_TYPE_CREATE: i32 = 1;
/// `filesystem.EventType`.
pub const EVENT_TYPE_WRITE: i32 = 2;
/// `filesystem.EventType`.
pub const EVENT_TYPE_REMOVE: i32 = 3;
/// `filesystem.EventType`.
pub const EVENT_TYPE_RENAME: i32 = 4;
/// `filesystem.EventType`.
pub const EVENT_TYPE_CHMOD: i32 = 5;

fn event_type_name<S: Serializer>(v: &i32, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(match *v {
        EVENT_TYPE_CREATE => "EVENT_TYPE_CREATE",
        EVENT_TYPE_WRITE => "EVENT_TYPE_WRITE",
        EVENT_TYPE_REMOVE => "EVENT_TYPE_REMOVE",
        EVENT_TYPE_RENAME => "EVENT_TYPE_RENAME",
        EVENT_TYPE_CHMOD => "EVENT_TYPE_CHMOD",
        _ => "EVENT_TYPE_UNSPECIFIED",
    })
}

fn event_type_enum<'de, D: Deserializer<'de>>(d: D) -> Result<i32, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum V {
        Num(i32),
        Name(String),
    }
    Ok(match Option::<V>::deserialize(d)? {
        None => 0,
        Some(V::Num(n)) => n,
        Some(V::Name(n)) => ["UNSPECIFIED", "CREATE", "WRITE", "REMOVE", "RENAME", "CHMOD"]
            .iter()
            .position(|x| n == format!("EVENT_TYPE_{x}"))
            .map(|i| i as i32)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown event type {n:?}")))?,
    })
}

/// `filesystem.FilesystemEvent`: `name` is relative to the watched directory.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct FilesystemEvent {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(int32, tag = "2")]
    #[serde(serialize_with = "event_type_name", deserialize_with = "event_type_enum")]
    pub r#type: i32,
}

/// `filesystem.WatchDirResponse`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(default)]
pub struct WatchDirResponse {
    #[prost(oneof = "watch_dir::Event", tags = "1, 2, 3")]
    #[serde(flatten)]
    pub event: Option<watch_dir::Event>,
}

/// The members of `filesystem.WatchDirResponse`.
pub mod watch_dir {
    use serde::{Deserialize, Serialize};

    /// The `event` oneof.
    #[derive(Clone, PartialEq, prost::Oneof, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub enum Event {
        #[prost(message, tag = "1")]
        Start(super::Empty),
        #[prost(message, tag = "2")]
        Filesystem(super::FilesystemEvent),
        #[prost(message, tag = "3")]
        Keepalive(super::Empty),
    }
}

/// `filesystem.CreateWatcherResponse`, `GetWatcherEventsRequest` and `RemoveWatcherRequest`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct WatcherId {
    #[prost(string, tag = "1")]
    pub watcher_id: String,
}

/// `filesystem.GetWatcherEventsResponse`.
#[derive(Clone, PartialEq, prost::Message, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct GetWatcherEventsResponse {
    #[prost(message, repeated, tag = "1")]
    pub events: Vec<FilesystemEvent>,
}

#[cfg(test)]
mod tests {
    use super::process_event::{DataEvent, EndEvent, Event, Output, StartEvent};
    use super::process_selector::Selector;
    use super::*;
    use prost::Message;
    use serde_json::json;

    #[test]
    fn process_events_use_the_proto3_json_mapping() {
        let start =
            StartResponse { event: Some(ProcessEvent { event: Some(Event::Start(StartEvent { pid: 7 })) }) };
        assert_eq!(serde_json::to_value(&start).unwrap(), json!({"event": {"start": {"pid": 7}}}));
        let data = StartResponse {
            event: Some(ProcessEvent {
                event: Some(Event::Data(DataEvent { output: Some(Output::Stderr(b"hi\n".to_vec())) })),
            }),
        };
        assert_eq!(serde_json::to_value(&data).unwrap(), json!({"event": {"data": {"stderr": "aGkK"}}}));
        let end = EndEvent { exit_code: 3, exited: true, status: "exit status 3".into(), error: None };
        assert_eq!(
            serde_json::to_value(&end).unwrap(),
            json!({"exitCode": 3, "exited": true, "status": "exit status 3"})
        );
    }

    #[test]
    fn requests_parse_from_json_with_oneofs_enums_and_lenient_numbers() {
        let r: StartRequest = serde_json::from_value(json!({
            "process": {"cmd": "/bin/bash", "args": ["-l", "-c", "echo hi"], "envs": {"A": "1"}, "cwd": "/tmp"},
            "stdin": false, "unknownField": 1
        }))
        .unwrap();
        let p = r.process.unwrap();
        assert_eq!((p.cmd.as_str(), p.args.len(), p.cwd.as_deref()), ("/bin/bash", 3, Some("/tmp")));
        assert_eq!(r.stdin, Some(false));
        let s: SendSignalRequest =
            serde_json::from_value(json!({"process": {"pid": 42}, "signal": "SIGNAL_SIGKILL"})).unwrap();
        assert_eq!(s.signal, SIGNAL_SIGKILL);
        assert_eq!(s.process.unwrap().selector, Some(Selector::Pid(42)));
        let s: SendSignalRequest =
            serde_json::from_value(json!({"process": {"pid": "9"}, "signal": 15})).unwrap();
        assert_eq!((s.process.unwrap().selector, s.signal), (Some(Selector::Pid(9)), 15));
        let none: ProcessSelector = serde_json::from_value(json!({})).unwrap();
        assert_eq!(none.selector, None);
        assert!(serde_json::from_value::<SendSignalRequest>(json!({"signal": "SIGNAL_SIGHUP"})).is_err());
        let l: ListDirRequest = serde_json::from_value(json!({"path": "/x", "depth": "2"})).unwrap();
        assert_eq!(l.depth, 2);
    }

    #[test]
    fn binary_encoding_matches_the_field_numbers() {
        // StartEvent{pid: 150} inside ProcessEvent field 1 inside StartResponse field 1.
        let start = StartResponse {
            event: Some(ProcessEvent { event: Some(Event::Start(StartEvent { pid: 150 })) }),
        };
        assert_eq!(start.encode_to_vec(), vec![0x0a, 0x05, 0x0a, 0x03, 0x08, 0x96, 0x01]);
        // sint32 exit_code uses zigzag: -1 -> 1.
        let end = EndEvent { exit_code: -1, ..Default::default() };
        assert_eq!(end.encode_to_vec(), vec![0x08, 0x01]);
        let sel = ProcessSelector::decode(&[0x08, 0x05][..]).unwrap();
        assert_eq!(sel.selector, Some(Selector::Pid(5)));
    }

    #[test]
    fn entries_write_types_sizes_and_times_as_json_does() {
        let e = EntryInfo {
            name: "a".into(),
            r#type: FILE_TYPE_DIRECTORY,
            path: "/a".into(),
            size: 1 << 40,
            modified_time: Some(Timestamp::from_ns(1_700_000_000_500_000_000)),
            ..Default::default()
        };
        let v = serde_json::to_value(&e).unwrap();
        assert_eq!(v["type"], "FILE_TYPE_DIRECTORY");
        assert_eq!(v["size"], "1099511627776");
        assert_eq!(v["modifiedTime"], "2023-11-14T22:13:20.500000000Z");
        assert_eq!(Timestamp::from_ns(0).rfc3339(), "1970-01-01T00:00:00Z");
        assert_eq!(Timestamp::from_ns(-1).rfc3339(), "1969-12-31T23:59:59.999999999Z");
    }
}

//! The event stream (`GET /v1/event/stream`), in Nomad's shape: every change the agent makes
//! (nodes, CSI plugins, volumes and their claims, jobs, allocs and their tasks' events,
//! devices) is one [`StreamEvent`] with a `Topic`, a `Type`, a `Key` and an `Index` that
//! increases by one per event over the agent's whole life (across restarts).
//!
//! The agent keeps a bounded window of the latest events on disk. A reader that reconnects
//! with the last index it saw (`?index=N`) gets every later event of the window, in order,
//! exactly once; when events it has not seen already left the window, a [`StreamLine::Missed`]
//! line says which. While nothing matches, a heartbeat line (`{}`) is sent every
//! `heartbeat` (default [`DEFAULT_HEARTBEAT`]).
//!
//! Payloads are built from the same summaries the API's status documents use: no spec, no
//! secret, no mount flag.

use std::{fmt, sync::Arc, time::Duration};

use serde::{Deserialize, Serialize};

/// What an event is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Topic {
    /// This node (or a node of the fleet): registration, drain.
    Node,
    /// A CSI plugin: instances registering, health, processes.
    #[serde(rename = "CSIPlugin")]
    CsiPlugin,
    /// A CSI volume: catalog changes, claims and releases.
    #[serde(rename = "CSIVolume")]
    CsiVolume,
    /// A job: run, stop, purge.
    Job,
    /// An alloc: its status, and its tasks' events.
    Allocation,
    /// A device plugin or device.
    Device,
}

impl Topic {
    /// Every topic.
    pub const ALL: [Topic; 6] = [
        Topic::Node,
        Topic::CsiPlugin,
        Topic::CsiVolume,
        Topic::Job,
        Topic::Allocation,
        Topic::Device,
    ];

    /// The name the stream and the filters use (`CSIVolume`).
    pub fn as_str(self) -> &'static str {
        match self {
            Topic::Node => "Node",
            Topic::CsiPlugin => "CSIPlugin",
            Topic::CsiVolume => "CSIVolume",
            Topic::Job => "Job",
            Topic::Allocation => "Allocation",
            Topic::Device => "Device",
        }
    }

    /// The topic named `s`, ignoring ASCII case.
    pub fn parse(s: &str) -> Option<Topic> {
        Topic::ALL
            .into_iter()
            .find(|t| t.as_str().eq_ignore_ascii_case(s))
    }
}

impl fmt::Display for Topic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct StreamEvent {
    /// What it is about.
    pub topic: Topic,
    /// What happened (`AllocationUpdated`, `VolumeClaimed`, `TaskStarted`, …).
    #[serde(rename = "Type")]
    pub kind: String,
    /// The object's id: the alloc, volume, plugin, job, node or device.
    pub key: String,
    /// Other ids it is about (an alloc's job and task, a claim's alloc); a key filter matches
    /// these too.
    #[serde(default)]
    pub filter_keys: Vec<String>,
    /// Its place in the stream.
    pub index: u64,
    /// When, in milliseconds since the epoch.
    pub time_ms: u64,
    /// What the object looks like now, or what happened, as a JSON object.
    pub payload: serde_json::Value,
}

/// An event as the agent keeps it: its routing facts and its JSON, serialized once.
#[derive(Debug, Clone)]
pub struct Published {
    /// The topic.
    pub topic: Topic,
    /// The key.
    pub key: String,
    /// The filter keys.
    pub filter_keys: Vec<String>,
    /// The index.
    pub index: u64,
    /// The [`StreamEvent`] as JSON.
    pub json: Arc<[u8]>,
}

impl Published {
    /// Serializes `event`.
    pub fn new(event: &StreamEvent) -> Result<Self, serde_json::Error> {
        Ok(Self {
            topic: event.topic,
            key: event.key.clone(),
            filter_keys: event.filter_keys.clone(),
            index: event.index,
            json: serde_json::to_vec(event)?.into(),
        })
    }

    /// Reads back an event serialized by [`Published::new`].
    pub fn from_json(json: &[u8]) -> Result<Self, serde_json::Error> {
        let event: StreamEvent = serde_json::from_slice(json)?;
        Ok(Self {
            topic: event.topic,
            key: event.key,
            filter_keys: event.filter_keys,
            index: event.index,
            json: json.into(),
        })
    }
}

/// Which events a reader wants: any of its `(topic, key)` pairs matches (a `None` topic is
/// every topic, a `None` key every key). The empty filter matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TopicFilter {
    terms: Vec<(Option<Topic>, Option<String>)>,
}

/// Most `topic` terms one request may carry.
pub const MAX_TOPIC_TERMS: usize = 64;

impl TopicFilter {
    /// Adds one `Topic`, `Topic:key`, `Topic:*`, `*` or `*:key` term, as Nomad's `topic` query
    /// parameter takes them.
    pub fn add(&mut self, term: &str) -> Result<(), crate::InvalidField> {
        let bad = |reason: String| crate::InvalidField {
            field: "topic",
            reason,
        };
        if self.terms.len() >= MAX_TOPIC_TERMS {
            return Err(bad(format!("at most {MAX_TOPIC_TERMS} terms")));
        }
        let (topic, key) = match term.split_once(':') {
            Some((t, k)) => (t, Some(k)),
            None => (term, None),
        };
        let topic = match topic {
            "*" => None,
            t => Some(Topic::parse(t).ok_or_else(|| {
                bad(format!(
                    "{} is not a topic; topics are {}",
                    berth_input::quoted(t),
                    Topic::ALL.map(Topic::as_str).join(", ")
                ))
            })?),
        };
        let key = match key {
            None | Some("*") => None,
            Some("") => return Err(bad("a key after ':' must not be empty".into())),
            Some(k) => {
                crate::checks::printable("topic", k, crate::volumes::MAX_FILE_NAME_BYTES)?;
                Some(k.to_owned())
            }
        };
        self.terms.push((topic, key));
        Ok(())
    }

    /// A filter of the given terms.
    pub fn parse<'a>(
        terms: impl IntoIterator<Item = &'a str>,
    ) -> Result<Self, crate::InvalidField> {
        let mut f = Self::default();
        for t in terms {
            f.add(t)?;
        }
        Ok(f)
    }

    /// Whether `event` passes.
    pub fn matches(&self, event: &Published) -> bool {
        self.terms.is_empty()
            || self.terms.iter().any(|(topic, key)| {
                topic.is_none_or(|t| t == event.topic)
                    && key
                        .as_deref()
                        .is_none_or(|k| event.key == k || event.filter_keys.iter().any(|f| f == k))
            })
    }

    /// The terms as query values (`Topic:key`), for a client.
    pub fn terms(&self) -> Vec<String> {
        self.terms
            .iter()
            .map(|(t, k)| {
                format!(
                    "{}:{}",
                    t.map_or("*", Topic::as_str),
                    k.as_deref().unwrap_or("*")
                )
            })
            .collect()
    }
}

/// One line of the stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StreamLine {
    /// Events, oldest first; `index` is the last one's.
    Events {
        /// The last event's index.
        #[serde(rename = "Index")]
        index: u64,
        /// The events.
        #[serde(rename = "Events")]
        events: Vec<StreamEvent>,
    },
    /// Events `from..=to` left the window before this reader got them.
    Missed {
        /// The range.
        #[serde(rename = "Missed")]
        missed: MissedRange,
    },
    /// Nothing happened for a while (`{}`).
    Heartbeat {},
}

/// The indexes a reader missed, both ends included.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "PascalCase")]
pub struct MissedRange {
    /// The first one missed.
    pub from: u64,
    /// The last one missed.
    pub to: u64,
}

/// What [`EventSource::read_after`] found.
#[derive(Debug, Clone, Default)]
pub struct WindowRead {
    /// Events after the index asked for, oldest first.
    pub events: Vec<Published>,
    /// Events after the index asked for that the window no longer holds.
    pub missed: Option<MissedRange>,
}

/// The agent's event window, as the stream route reads it.
pub trait EventSource: Send + Sync + 'static {
    /// At most `max` events with an index above `after`, oldest first, and the range that left
    /// the window, if any.
    fn read_after(&self, after: u64, max: usize) -> WindowRead;
    /// The index of the newest event; it changes after the event can be read.
    fn watch_last(&self) -> tokio::sync::watch::Receiver<u64>;
}

/// The heartbeat interval unless the request sets one.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(10);

/// The shortest and longest `heartbeat` a request may ask for.
pub const HEARTBEAT_RANGE: (Duration, Duration) =
    (Duration::from_millis(100), Duration::from_secs(300));

#[cfg(test)]
mod tests {
    use super::*;

    fn published(topic: Topic, key: &str, filter_keys: &[&str]) -> Published {
        Published::new(&StreamEvent {
            topic,
            kind: "X".into(),
            key: key.into(),
            filter_keys: filter_keys.iter().map(|s| s.to_string()).collect(),
            index: 1,
            time_ms: 0,
            payload: serde_json::json!({}),
        })
        .unwrap()
    }

    #[test]
    fn filters_match_topics_keys_and_filter_keys() {
        let alloc = published(Topic::Allocation, "a1", &["web"]);
        let job = published(Topic::Job, "web", &[]);
        let f = TopicFilter::parse(["Allocation:web"]).unwrap();
        assert!(f.matches(&alloc));
        assert!(!f.matches(&job));
        let f = TopicFilter::parse(["*:web"]).unwrap();
        assert!(f.matches(&alloc) && f.matches(&job));
        let f = TopicFilter::parse(["job"]).unwrap();
        assert!(!f.matches(&alloc) && f.matches(&job));
        assert!(TopicFilter::default().matches(&alloc));
        let f = TopicFilter::parse(["Job:other", "CSIVolume"]).unwrap();
        assert!(!f.matches(&job));
    }

    #[test]
    fn bad_terms_name_the_field() {
        let e = TopicFilter::parse(["Jobs"]).unwrap_err();
        assert_eq!(e.field, "topic");
        assert!(e.reason.contains("\"Jobs\" is not a topic"), "{}", e.reason);
        assert!(TopicFilter::parse(["Job:"]).is_err());
        assert!(TopicFilter::parse(["Job:a\u{1b}b"]).is_err());
    }

    #[test]
    fn lines_have_nomads_shape() {
        let line = StreamLine::Heartbeat {};
        assert_eq!(serde_json::to_string(&line).unwrap(), "{}");
        let back: StreamLine = serde_json::from_str("{}").unwrap();
        assert_eq!(back, StreamLine::Heartbeat {});
        let missed: StreamLine = serde_json::from_str(r#"{"Missed":{"From":3,"To":9}}"#).unwrap();
        assert_eq!(
            missed,
            StreamLine::Missed {
                missed: MissedRange { from: 3, to: 9 }
            }
        );
        let ev = published(Topic::CsiVolume, "v", &[]);
        let text = format!(
            r#"{{"Index":1,"Events":[{}]}}"#,
            std::str::from_utf8(&ev.json).unwrap()
        );
        let StreamLine::Events { index, events } = serde_json::from_str(&text).unwrap() else {
            panic!("not events: {text}");
        };
        assert_eq!(index, 1);
        assert_eq!(events[0].topic, Topic::CsiVolume);
        assert!(
            text.contains(r#""Topic":"CSIVolume","Type":"X","Key":"v""#),
            "{text}"
        );
    }
}

//! Captured log lines, so tests can check what code under test logged and
//! in which span.
//!
//! [`capture`] collects what the current thread logs: use it in a
//! `#[tokio::test]` on the default single-threaded runtime, where every task
//! runs on the test's thread.
//!
//! One global subscriber serves every test of the binary (installed by the
//! first [`capture`] or [`crate::init_tracing`]) and hands each event to the
//! capture of the thread it happens on. A thread-local subscriber per test
//! would be simpler, but `tracing` caches per call site whether anyone is
//! interested, and tests on other threads registering the same call sites
//! with no subscriber make it miss events.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, Once};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

/// One event, with the fields of the spans it was in (outermost first,
/// inner ones overriding) and its own fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// `TRACE` … `ERROR`.
    pub level: tracing::Level,
    /// The event's target (module path unless set).
    pub target: String,
    /// The event's message.
    pub message: String,
    /// Span and event fields by name, formatted with `Debug`/`Display`.
    pub fields: BTreeMap<String, String>,
}

impl LogLine {
    /// The field `name`, if present.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

/// The lines captured so far.
#[derive(Debug, Clone, Default)]
pub struct Captured {
    lines: Arc<Mutex<Vec<LogLine>>>,
}

impl Captured {
    /// Every line so far, in order.
    pub fn lines(&self) -> Vec<LogLine> {
        self.lock().clone()
    }

    /// The lines whose message contains `text`.
    pub fn containing(&self, text: &str) -> Vec<LogLine> {
        self.lock().iter().filter(|l| l.message.contains(text)).cloned().collect()
    }

    fn lock(&self) -> MutexGuard<'_, Vec<LogLine>> {
        self.lines.lock().unwrap_or_else(|poison| poison.into_inner())
    }
}

thread_local! {
    /// Where events of this thread go, while a [`capture`] guard lives.
    static CURRENT: RefCell<Option<Captured>> = const { RefCell::new(None) };
}

/// Ends a capture when dropped.
#[derive(Debug)]
pub struct CaptureGuard {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for CaptureGuard {
    fn drop(&mut self) {
        CURRENT.with(|current| current.borrow_mut().take());
    }
}

/// Captures every event of the current thread, at every level, until the
/// guard is dropped.
pub fn capture() -> (Captured, CaptureGuard) {
    install();
    let captured = Captured::default();
    CURRENT.with(|current| *current.borrow_mut() = Some(captured.clone()));
    (captured, CaptureGuard { _not_send: std::marker::PhantomData })
}

/// Installs the global subscriber once: captures for [`capture`], and the
/// test's output filtered by `RUST_LOG` (default: `warn`).
pub(crate) fn install() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let output = tracing_subscriber::fmt::layer().with_test_writer().with_filter(filter);
        let subscriber = tracing_subscriber::registry().with(CaptureLayer).with(output);
        // Fails only if the test installed its own subscriber: then it owns
        // the output, and captures stay empty.
        let _ = tracing::subscriber::set_global_default(subscriber);
    });
}

struct CaptureLayer;

/// Fields of a span, kept in its extensions.
#[derive(Default)]
struct SpanFields(BTreeMap<String, String>);

struct FieldVisitor<'a>(&'a mut BTreeMap<String, String>);

impl Visit for FieldVisitor<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl<S> Layer<S> for CaptureLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = SpanFields::default();
        attrs.record(&mut FieldVisitor(&mut fields.0));
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(fields) = span.extensions_mut().get_mut::<SpanFields>()
        {
            values.record(&mut FieldVisitor(&mut fields.0));
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let Some(captured) = CURRENT.with(|current| current.borrow().clone()) else { return };
        let mut fields = BTreeMap::new();
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                if let Some(span_fields) = span.extensions().get::<SpanFields>() {
                    fields.extend(span_fields.0.clone());
                }
            }
        }
        event.record(&mut FieldVisitor(&mut fields));
        let message = fields.remove("message").unwrap_or_default();
        let line = LogLine {
            level: *event.metadata().level(),
            target: event.metadata().target().to_owned(),
            message,
            fields,
        };
        captured.lock().push(line);
    }
}

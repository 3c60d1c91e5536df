//! A streamed response: its typed events (`response.created`, the items and their parts
//! opened, filled and closed in order, then `response.completed` or `response.incomplete`),
//! each with its `sequence_number`.

use super::*;
use crate::wire_responses::{ResponseEvent, ResponseEventKind, ResponseEventKind as E};

/// The kind of the item a stream has open.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Open {
    Reasoning,
    Message,
    Call,
}

/// One output item of a streamed response: its kind, id, and text (or a call's
/// arguments) so far.
struct Item {
    kind: Open,
    id: String,
    text: String,
    /// A call's id and name.
    call: Option<(String, String)>,
}

/// A streamed response: the typed events of each piece of output, items opened and
/// closed in order.
pub(crate) struct Stream {
    echo: Box<Echo>,
    id: String,
    ids: CallIds,
    items: Vec<Item>,
    /// The last item is open.
    open: bool,
    seq: u64,
    /// Every generated token's log-probabilities (for the message's output text).
    logprobs: Vec<(u32, TokenLogprobs)>,
    tokenizer: Arc<Tokenizer>,
}

impl Stream {
    pub fn new(echo: Box<Echo>, id_seed: u64, tokenizer: Arc<Tokenizer>) -> Self {
        let (id, ids) = ids(id_seed);
        Stream {
            echo,
            id,
            ids,
            items: Vec::new(),
            open: false,
            seq: 0,
            logprobs: Vec::new(),
            tokenizer,
        }
    }

    fn event(&mut self, event: ResponseEventKind) -> Typed {
        let name = event.name();
        let e = ResponseEvent {
            event,
            sequence_number: self.seq,
        };
        self.seq += 1;
        (name, serde_json::to_value(e).unwrap_or_default())
    }

    fn snapshot(
        &self,
        reply: &Reply,
        status: &'static str,
        incomplete: Option<IncompleteDetails>,
        usage: Option<ResponseUsage>,
    ) -> ResponseObject {
        let output = (0..self.items.len())
            .map(|i| {
                self.item_json(
                    i,
                    if self.open && i + 1 == self.items.len() {
                        "in_progress"
                    } else {
                        "completed"
                    },
                )
            })
            .collect();
        response(
            reply, &self.id, &self.echo, status, incomplete, output, usage,
        )
    }

    fn item_json(&self, i: usize, status: &'static str) -> OutputItem {
        let it = &self.items[i];
        match it.kind {
            Open::Reasoning => reasoning_item(&it.id, &it.text, &self.echo, status),
            Open::Message => {
                let lps = if self.echo.logprobs {
                    logprob_entries(&self.tokenizer, &self.logprobs)
                } else {
                    Vec::new()
                };
                message_item(&it.id, &it.text, &lps, status)
            }
            Open::Call => {
                let (call_id, name) = it.call.clone().unwrap_or_default();
                call_item(&it.id, &call_id, &name, &it.text, status)
            }
        }
    }

    /// The events that open the response.
    pub fn start(&mut self, reply: &Reply) -> Vec<Typed> {
        let r = Box::new(self.snapshot(reply, "in_progress", None, None));
        vec![
            self.event(E::Created {
                response: r.clone(),
            }),
            self.event(E::InProgress { response: r }),
        ]
    }

    /// Close the open item.
    fn close(&mut self, out: &mut Vec<Typed>) {
        if !self.open {
            return;
        }
        self.open = false;
        let i = self.items.len() - 1;
        let (id, text) = (self.items[i].id.clone(), self.items[i].text.clone());
        match self.items[i].kind {
            Open::Reasoning => {
                let part = ContentPart::ReasoningText { text: text.clone() };
                let e = E::ReasoningTextDone {
                    item_id: id.clone(),
                    output_index: i,
                    content_index: 0,
                    text,
                };
                out.push(self.event(e));
                let e = E::ContentPartDone {
                    item_id: id,
                    output_index: i,
                    content_index: 0,
                    part,
                };
                out.push(self.event(e));
            }
            Open::Message => {
                let lps = if self.echo.logprobs {
                    logprob_entries(&self.tokenizer, &self.logprobs)
                } else {
                    Vec::new()
                };
                let part = text_part(&text, &lps);
                let e = E::OutputTextDone {
                    item_id: id.clone(),
                    output_index: i,
                    content_index: 0,
                    text,
                    logprobs: lps,
                };
                out.push(self.event(e));
                let e = E::ContentPartDone {
                    item_id: id,
                    output_index: i,
                    content_index: 0,
                    part,
                };
                out.push(self.event(e));
            }
            Open::Call => {
                let name = self.items[i].call.as_ref().map(|c| c.1.clone());
                let e = E::FunctionCallArgumentsDone {
                    item_id: id,
                    output_index: i,
                    name,
                    arguments: text,
                };
                out.push(self.event(e));
            }
        }
        let item = self.item_json(i, "completed");
        out.push(self.event(E::OutputItemDone {
            output_index: i,
            item,
        }));
    }

    /// Open an item of `kind` (closing the one open), unless one of that kind is open.
    fn ensure(&mut self, kind: Open, out: &mut Vec<Typed>) {
        if self.open && self.items.last().is_some_and(|it| it.kind == kind) && kind != Open::Call {
            return;
        }
        self.close(out);
        let prefix = match kind {
            Open::Reasoning => "rs",
            Open::Message => "msg",
            Open::Call => "fc",
        };
        let id = self.ids.item(prefix);
        self.items.push(Item {
            kind,
            id,
            text: String::new(),
            call: None,
        });
        self.open = true;
    }

    /// Announce the item just opened (a call once its id and name are set).
    fn added(&mut self, out: &mut Vec<Typed>) {
        let i = self.items.len() - 1;
        let item = self.item_json(i, "in_progress");
        out.push(self.event(E::OutputItemAdded {
            output_index: i,
            item,
        }));
        let id = self.items[i].id.clone();
        let part = match self.items[i].kind {
            Open::Reasoning => ContentPart::ReasoningText {
                text: String::new(),
            },
            Open::Message => text_part("", &[]),
            Open::Call => return,
        };
        let e = E::ContentPartAdded {
            item_id: id,
            output_index: i,
            content_index: 0,
            part,
        };
        out.push(self.event(e));
    }

    /// The events of one token's output `d` (its log-probabilities `lp`).
    pub fn token(&mut self, d: &Delta, lp: Option<(u32, TokenLogprobs)>) -> Vec<Typed> {
        let mut out = Vec::new();
        let lp_now = lp.clone();
        if let Some(x) = lp {
            self.logprobs.push(x);
        }
        if !d.reasoning.is_empty() {
            let was = self.open
                && self
                    .items
                    .last()
                    .is_some_and(|it| it.kind == Open::Reasoning);
            self.ensure(Open::Reasoning, &mut out);
            if !was {
                self.added(&mut out);
            }
            let i = self.items.len() - 1;
            self.items[i].text.push_str(&d.reasoning);
            let e = E::ReasoningTextDelta {
                item_id: self.items[i].id.clone(),
                output_index: i,
                content_index: 0,
                delta: d.reasoning.clone(),
            };
            out.push(self.event(e));
        }
        if !d.content.is_empty() {
            let was = self.open && self.items.last().is_some_and(|it| it.kind == Open::Message);
            self.ensure(Open::Message, &mut out);
            if !was {
                self.added(&mut out);
            }
            let i = self.items.len() - 1;
            self.items[i].text.push_str(&d.content);
            let lps = match (&lp_now, self.echo.logprobs) {
                (Some(x), true) => logprob_entries(&self.tokenizer, std::slice::from_ref(x)),
                _ => Vec::new(),
            };
            let e = E::OutputTextDelta {
                item_id: self.items[i].id.clone(),
                output_index: i,
                content_index: 0,
                delta: d.content.clone(),
                logprobs: lps,
            };
            out.push(self.event(e));
        }
        for c in &d.calls {
            let args = c.function.arguments.as_str();
            if let Some(call_id) = &c.id {
                // A new call: its id and name.
                let name = c.function.name.clone().unwrap_or_default();
                self.ensure(Open::Call, &mut out);
                let i = self.items.len() - 1;
                self.items[i].call = Some((call_id.to_string(), name));
                self.added(&mut out);
            }
            // Arguments go to the call item open (a call's header always comes first).
            let open_call = self.open && self.items.last().is_some_and(|it| it.kind == Open::Call);
            if !args.is_empty() && open_call {
                let i = self.items.len() - 1;
                self.items[i].text.push_str(args);
                let e = E::FunctionCallArgumentsDelta {
                    item_id: self.items[i].id.clone(),
                    output_index: i,
                    delta: args.to_string(),
                };
                out.push(self.event(e));
            }
        }
        out
    }

    /// The events that end the response.
    pub fn end(&mut self, reply: &Reply, end: &Ending) -> Vec<Typed> {
        let mut out = Vec::new();
        if self.items.is_empty() {
            // An empty answer is still a message.
            self.ensure(Open::Message, &mut out);
            self.added(&mut out);
        }
        self.close(&mut out);
        let reasoning: String = self
            .items
            .iter()
            .filter(|it| it.kind == Open::Reasoning)
            .map(|it| it.text.as_str())
            .collect();
        let (status, incomplete) = status(end.finish);
        let u = usage(
            end.prompt,
            end.completion,
            tokens_of(&self.tokenizer, &reasoning),
        );
        let response = Box::new(self.snapshot(reply, status, incomplete, Some(u)));
        out.push(self.event(match status {
            "completed" => E::Completed { response },
            "incomplete" => E::Incomplete { response },
            _ => E::Failed { response },
        }));
        out
    }

    /// The event of an error that ends the stream.
    pub fn error(&mut self, e: &ApiError) -> Vec<Typed> {
        let err = e.body().error;
        vec![self.event(E::Error {
            code: err.code,
            message: err.message,
            param: err.param,
        })]
    }
}

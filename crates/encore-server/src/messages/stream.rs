//! A streamed message: its content blocks opened, filled and closed in order, as
//! Anthropic's events (`message_start`, `content_block_start` / `_delta` / `_stop`,
//! `message_delta`, `message_stop`).

use super::*;

/// The kind of the content block a stream has open.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Block {
    Thinking,
    Text,
    ToolUse,
}

/// A streamed message: its content blocks opened, filled and closed in order.
pub(crate) struct Stream {
    id: String,
    /// The open block and its index.
    open: Option<(usize, Block)>,
    blocks: usize,
    called: bool,
    /// Thinking blocks come without their text.
    omit_thinking: bool,
}

impl Stream {
    pub fn new(id_seed: u64, omit_thinking: bool) -> Self {
        Stream {
            id: message_id(id_seed),
            open: None,
            blocks: 0,
            called: false,
            omit_thinking,
        }
    }

    fn event(e: MessageEvent) -> Typed {
        (e.name(), serde_json::to_value(e).unwrap_or_default())
    }

    /// The event that opens the message.
    pub fn start(&mut self, reply: &Reply, prompt: usize) -> Vec<Typed> {
        let message = Message {
            id: self.id.clone(),
            kind: "message",
            role: "assistant",
            model: reply.model.clone(),
            content: Vec::new(),
            stop_reason: None,
            stop_sequence: None,
            usage: MessageUsage {
                input_tokens: prompt,
                output_tokens: 0,
            },
        };
        vec![Self::event(MessageEvent::MessageStart { message })]
    }

    fn close(&mut self, out: &mut Vec<Typed>) {
        if let Some((index, _)) = self.open.take() {
            out.push(Self::event(MessageEvent::ContentBlockStop { index }));
        }
    }

    /// Open a block (closing the one open) unless one of `kind` is open and `reuse`.
    fn open(
        &mut self,
        kind: Block,
        content_block: ContentBlock,
        reuse: bool,
        out: &mut Vec<Typed>,
    ) -> usize {
        if let Some((i, k)) = self.open {
            if k == kind && reuse {
                return i;
            }
        }
        self.close(out);
        let index = self.blocks;
        self.blocks += 1;
        self.open = Some((index, kind));
        out.push(Self::event(MessageEvent::ContentBlockStart {
            index,
            content_block,
        }));
        index
    }

    /// The event of `delta` to block `index`.
    fn delta(index: usize, delta: BlockDelta) -> Typed {
        Self::event(MessageEvent::ContentBlockDelta { index, delta })
    }

    /// The events of one token's output `d`.
    pub fn token(&mut self, d: &Delta) -> Vec<Typed> {
        let mut out = Vec::new();
        if !d.reasoning.is_empty() {
            let b = ContentBlock::Thinking {
                thinking: String::new(),
                signature: String::new(),
            };
            let i = self.open(Block::Thinking, b, true, &mut out);
            if !self.omit_thinking {
                let thinking = d.reasoning.clone();
                out.push(Self::delta(i, BlockDelta::ThinkingDelta { thinking }));
            }
        }
        if !d.content.is_empty() {
            let b = ContentBlock::Text {
                text: String::new(),
            };
            let i = self.open(Block::Text, b, true, &mut out);
            let text = d.content.clone();
            out.push(Self::delta(i, BlockDelta::TextDelta { text }));
        }
        for c in &d.calls {
            if let Some(id) = &c.id {
                let b = ContentBlock::ToolUse {
                    id: id.clone(),
                    name: c.function.name.clone().unwrap_or_default(),
                    input: json!({}),
                };
                self.open(Block::ToolUse, b, false, &mut out);
                self.called = true;
            }
            let args = &c.function.arguments;
            if let (false, Some((i, Block::ToolUse))) = (args.is_empty(), self.open) {
                let partial_json = args.clone();
                out.push(Self::delta(i, BlockDelta::InputJsonDelta { partial_json }));
            }
        }
        out
    }

    /// The events that end the message.
    pub fn end(&mut self, end: &Ending) -> Vec<Typed> {
        let mut out = Vec::new();
        if self.blocks == 0 {
            // An empty answer is still a text block, as whole.
            let b = ContentBlock::Text {
                text: String::new(),
            };
            self.open(Block::Text, b, true, &mut out);
        }
        self.close(&mut out);
        let delta = MessageDelta {
            stop_reason: Some(stop_reason(end, self.called)),
            stop_sequence: end.stop.clone(),
        };
        let usage = OutputUsage {
            output_tokens: end.completion,
        };
        out.push(Self::event(MessageEvent::MessageDelta { delta, usage }));
        out.push(Self::event(MessageEvent::MessageStop));
        out
    }

    /// The event of an error that ends the stream.
    pub fn error(&mut self, e: &ApiError) -> Vec<Typed> {
        let error = error_body(e).error;
        vec![Self::event(MessageEvent::Error { error })]
    }
}

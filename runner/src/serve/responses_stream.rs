//! A streamed response: the Responses API's events, each numbered (`sequence_number`).
//! `response.created` and `response.in_progress`; once the `<tool_call>` list is complete,
//! each call as a `function_call` item (added, its arguments, done); the text as a
//! `message` item, its `output_text` deltas as the text grows (after the calls, as Needle
//! writes it); then `response.completed` (`response.incomplete` when the answer ran out of
//! tokens) with the whole response, whose items are the ones streamed.

use crate::prompt::Answer;
use crate::serve::request::{AnswerForm, ChatRequest};
use crate::serve::responses_object::{
    call_item_id, calls, function_call_item, has_message, incomplete, message_id, message_item,
    output_text, response_object, ResponseMeta,
};
use crate::serve::scheduler::{Done, Event};
use crate::serve::shared::{answer_in_form, final_answer, ChoiceEvents, DecoderEvents, Shared};
use crate::serve::stop::StopTexts;
use crate::stream::stable_text;
use axum::response::sse::{Event as SseEvent, Sse};
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

pub fn stream(
    s: Arc<Shared>,
    meta: ResponseMeta,
    request: &ChatRequest,
    events: ChoiceEvents,
    deadline: tokio::time::Instant,
    arrived: Instant,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    let mut state = Streamer {
        s,
        meta,
        stops: request.stop.clone(),
        form: request.form,
        decoder: DecoderEvents::new(events, deadline, arrived),
        ids: Vec::new(),
        sequence: 0,
        calls_sent: false,
        message_sent: None,
        pending: VecDeque::new(),
        finished: false,
    };
    let object = response_object(&state.meta, None, state.s.provider);
    state.send("response.created", json!({"response": object}));
    state.send("response.in_progress", json!({"response": object}));
    let events = futures_util::stream::unfold(state, |mut state| async move {
        let (kind, data) = state.next().await?;
        Some((Ok(SseEvent::default().event(kind).data(data)), state))
    });
    Sse::new(events)
}

struct Streamer {
    s: Arc<Shared>,
    meta: ResponseMeta,
    stops: StopTexts,
    /// Calls, or one JSON value as the content (`response_format`).
    form: AnswerForm,
    decoder: DecoderEvents,
    ids: Vec<u32>,
    sequence: u64,
    /// Whether the calls' items were sent.
    calls_sent: bool,
    /// The message item's text sent so far, once it was added.
    message_sent: Option<String>,
    /// Events to send: their type and data.
    pending: VecDeque<(String, String)>,
    finished: bool,
}

impl Streamer {
    fn send(&mut self, kind: &str, mut event: Value) {
        event["type"] = json!(kind);
        event["sequence_number"] = json!(self.sequence);
        self.sequence += 1;
        self.pending
            .push_back((kind.to_string(), event.to_string()));
    }

    async fn next(&mut self) -> Option<(String, String)> {
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Some(event);
            }
            if self.finished {
                return None;
            }
            match self.decoder.next(&self.s).await {
                (_, Event::Token(sampled)) => {
                    self.ids.push(sampled.id);
                    let text = stable_text(&self.s.tokenizer, &self.ids);
                    let partial = answer_in_form(self.stops.shown(&text), self.form);
                    self.send_growth(&partial, false);
                }
                (_, Event::Done(done)) => self.finish(done),
                (_, Event::Failed(why)) => self.fail(&why),
            }
        }
    }

    /// Sends the call items once the call list is complete, then what the text gained;
    /// `last` opens the message item even without text when the answer needs one.
    fn send_growth(&mut self, answer: &Answer, last: bool) {
        let id = self.meta.id.clone();
        if !self.calls_sent && answer.calls.is_ok() {
            self.calls_sent = true;
            for (i, (name, arguments)) in calls(answer).into_iter().enumerate() {
                let item_id = call_item_id(&id, i);
                let added = function_call_item(&id, i, &name, "", "in_progress");
                self.send(
                    "response.output_item.added",
                    json!({"output_index": i, "item": added}),
                );
                self.send(
                    "response.function_call_arguments.delta",
                    json!({"item_id": item_id, "output_index": i, "delta": arguments}),
                );
                self.send(
                    "response.function_call_arguments.done",
                    json!({"item_id": item_id, "output_index": i, "name": name, "arguments": arguments}),
                );
                let done = function_call_item(&id, i, &name, &arguments, "completed");
                self.send(
                    "response.output_item.done",
                    json!({"output_index": i, "item": done}),
                );
            }
        }
        if !self.calls_sent && !last {
            return;
        }
        let index = calls(answer).len();
        let item_id = message_id(&id);
        let opens = !answer.text.is_empty() || (last && has_message(answer));
        if self.message_sent.is_none() && opens {
            self.message_sent = Some(String::new());
            let added = message_item(&id, None, "in_progress");
            self.send(
                "response.output_item.added",
                json!({"output_index": index, "item": added}),
            );
            self.send(
                "response.content_part.added",
                json!({"item_id": item_id, "output_index": index, "content_index": 0, "part": output_text("")}),
            );
        }
        let Some(sent) = self.message_sent.clone() else {
            return;
        };
        if answer.text.len() > sent.len() && answer.text.starts_with(sent.as_str()) {
            let delta = &answer.text[sent.len()..];
            self.send(
                "response.output_text.delta",
                json!({"item_id": item_id, "output_index": index, "content_index": 0, "delta": delta, "logprobs": []}),
            );
            self.message_sent = Some(answer.text.clone());
        }
    }

    fn finish(&mut self, done: Box<Done>) {
        let answer = final_answer(&self.s, &done, &self.stops, self.form);
        self.send_growth(&answer, true);
        if self.message_sent.is_some() {
            let id = self.meta.id.clone();
            let (item_id, index) = (message_id(&id), calls(&answer).len());
            let text = answer.text.clone();
            self.send(
                "response.output_text.done",
                json!({"item_id": item_id, "output_index": index, "content_index": 0, "text": text, "logprobs": []}),
            );
            self.send(
                "response.content_part.done",
                json!({"item_id": item_id, "output_index": index, "content_index": 0, "part": output_text(&text)}),
            );
            let item = message_item(&id, Some(&text), "completed");
            self.send(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            );
        }
        let object = response_object(&self.meta, Some((&answer, &done)), self.s.provider);
        let kind = match incomplete(&answer, &done) {
            true => "response.incomplete",
            false => "response.completed",
        };
        self.send(kind, json!({"response": object}));
        self.end();
    }

    fn fail(&mut self, why: &str) {
        self.send(
            "error",
            json!({"code": "server_error", "message": why, "param": null}),
        );
        self.end();
    }

    fn end(&mut self) {
        self.s.metrics.request_done(self.decoder.arrived.elapsed());
        self.finished = true;
    }
}

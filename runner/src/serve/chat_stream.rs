//! A streamed chat completion (server-sent events): for each choice a first chunk with
//! the role, `reasoning_content` and `content` deltas as its text grows (each trimmed as
//! the whole answer's is, so they add up to it), each call announced (id, name) once its
//! name is decoded and its arguments sent as the model writes them ([`call_stream`]),
//! then its `finish_reason` chunk with Needle's extras; once every choice is done the
//! usage chunk if asked for, and `[DONE]`. Each chunk carries the `logprobs` entries of
//! its choice's tokens since the previous one, when asked for.

use crate::prompt::Answer;
use crate::serve::call_stream::partial_calls;
use crate::serve::request::{AnswerForm, ChatRequest};
use crate::serve::response::{self, Meta};
use crate::serve::scheduler::{Done, Event};
use crate::serve::shared::{
    answer_in_form, final_answer, now, ChoiceEvents, DecoderEvents, Shared,
};
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
    id: String,
    request: &ChatRequest,
    events: ChoiceEvents,
    deadline: tokio::time::Instant,
    arrived: Instant,
) -> Sse<impl futures_util::Stream<Item = Result<SseEvent, Infallible>>> {
    let mut state = Streamer {
        s,
        id,
        created: now(),
        include_usage: request.include_usage,
        logprobs: request.top_logprobs.is_some(),
        stops: request.stop.clone(),
        form: request.form,
        decoder: DecoderEvents::new(events, deadline, arrived),
        choices: (0..request.n).map(|_| ChoiceState::default()).collect(),
        pending: VecDeque::new(),
        finished: false,
    };
    for index in 0..request.n {
        let role = json!({"role": "assistant", "content": ""});
        let first = response::chunk(&state.meta(), index, role, None, None);
        state.pending.push_back(first.to_string());
    }
    let events = futures_util::stream::unfold(state, |mut state| async move {
        let data = state.next().await?;
        Some((Ok(SseEvent::default().data(data)), state))
    });
    Sse::new(events)
}

/// What one choice has generated and sent.
struct ChoiceState {
    ids: Vec<u32>,
    /// The reasoning and text sent so far.
    sent: Answer,
    /// `logprobs` entries of tokens not yet sent.
    logprobs: Vec<Value>,
    /// The calls announced, in order: how many bytes of each one's arguments were sent.
    calls: Vec<usize>,
    done: Option<Box<Done>>,
}

impl Default for ChoiceState {
    fn default() -> Self {
        ChoiceState {
            ids: Vec::new(),
            sent: Answer {
                reasoning: String::new(),
                calls: Ok(Value::Null),
                text: String::new(),
            },
            logprobs: Vec::new(),
            calls: Vec::new(),
            done: None,
        }
    }
}

struct Streamer {
    s: Arc<Shared>,
    id: String,
    created: u64,
    include_usage: bool,
    logprobs: bool,
    stops: StopTexts,
    /// Calls, or one JSON value as the content (`response_format`).
    form: AnswerForm,
    decoder: DecoderEvents,
    choices: Vec<ChoiceState>,
    pending: VecDeque<String>,
    finished: bool,
}

impl Streamer {
    fn meta(&self) -> Meta<'_> {
        Meta {
            id: &self.id,
            created: self.created,
            model: &self.s.model,
        }
    }

    async fn next(&mut self) -> Option<String> {
        loop {
            if let Some(data) = self.pending.pop_front() {
                return Some(data);
            }
            if self.finished {
                return None;
            }
            match self.decoder.next(&self.s).await {
                (index, Event::Token(sampled)) => {
                    let entry = response::logprob_entry(&self.s.token_bytes, &sampled);
                    let choice = &mut self.choices[index];
                    choice.ids.push(sampled.id);
                    if sampled.logprobs.is_some() {
                        choice.logprobs.push(entry);
                    }
                    let text = stable_text(&self.s.tokenizer, &choice.ids);
                    let shown = self.stops.shown(&text);
                    self.send_growth(index, &answer_in_form(shown, self.form));
                    if matches!(self.form, AnswerForm::Calls { .. }) {
                        self.send_call_growth(index, shown);
                    }
                }
                (index, Event::Done(done)) => self.finish_choice(index, done),
                (_, Event::Failed(why)) => self.fail(&why),
            }
        }
    }

    /// The `logprobs` entries choice `index` has not sent, for its next chunk.
    fn take_logprobs(&mut self, index: usize) -> Option<Vec<Value>> {
        self.logprobs
            .then(|| std::mem::take(&mut self.choices[index].logprobs))
    }

    /// Sends the rest of choice `index`, its calls and its finish; then, when every
    /// choice is done, the usage and `[DONE]`.
    fn finish_choice(&mut self, index: usize, done: Box<Done>) {
        let answer = final_answer(&self.s, &done, &self.stops, self.form);
        self.send_growth(index, &answer);
        self.send_rest_of_calls(index, &answer, &done);
        let logprobs = self.take_logprobs(index);
        let finish = response::finish_reason(&answer, &done);
        let mut last = response::chunk(
            &self.meta(),
            index,
            json!({}),
            Some(finish),
            logprobs.as_deref(),
        );
        last["needle"] = response::needle_extras(&answer, &done, self.s.provider);
        self.pending.push_back(last.to_string());
        self.choices[index].done = Some(done);
        if self.choices.iter().all(|c| c.done.is_some()) {
            if self.include_usage {
                let mut usage = response::chunk(&self.meta(), 0, json!({}), None, None);
                usage["choices"] = json!([]);
                usage["usage"] =
                    response::usage(self.choices.iter().flat_map(|c| c.done.as_deref()));
                self.pending.push_back(usage.to_string());
            }
            self.end();
        }
    }

    /// Sends what choice `index`'s reasoning and text gained over what was sent.
    fn send_growth(&mut self, index: usize, now: &Answer) {
        let mut delta = serde_json::Map::new();
        let sent = &mut self.choices[index].sent;
        for (key, was, is) in [
            ("reasoning_content", &mut sent.reasoning, &now.reasoning),
            ("content", &mut sent.text, &now.text),
        ] {
            if is.len() > was.len() && is.starts_with(was.as_str()) {
                delta.insert(key.into(), Value::String(is[was.len()..].to_string()));
                *was = is.clone();
            }
        }
        if !delta.is_empty() {
            let logprobs = self.take_logprobs(index);
            let chunk = response::chunk(
                &self.meta(),
                index,
                Value::Object(delta),
                None,
                logprobs.as_deref(),
            );
            self.pending.push_back(chunk.to_string());
        }
    }

    /// Announces the calls of choice `index` whose names the `shown` text now completes and
    /// sends what their arguments gained. A call is announced only after those before it,
    /// so indices stay in order.
    fn send_call_growth(&mut self, index: usize, shown: &str) {
        for (i, call) in partial_calls(shown).into_iter().enumerate() {
            let Some(name) = call.name else {
                break;
            };
            self.send_call_text(index, i, &name, call.arguments.unwrap_or_default());
        }
    }

    /// Sends call `i` of choice `index`: announced with `arguments` if it was not, else
    /// what `arguments` gained over what was sent.
    fn send_call_text(&mut self, index: usize, i: usize, name: &str, arguments: &str) {
        let sent = &mut self.choices[index].calls;
        let delta = if i == sent.len() {
            sent.push(arguments.len());
            let id = response::call_id(&self.id, index, i);
            json!({"index": i, "id": id, "type": "function", "function": {"name": name, "arguments": arguments}})
        } else {
            match arguments.get(sent[i]..).filter(|gained| !gained.is_empty()) {
                Some(gained) => {
                    sent[i] = arguments.len();
                    json!({"index": i, "function": {"arguments": gained}})
                }
                None => return,
            }
        };
        let chunk = response::chunk(
            &self.meta(),
            index,
            json!({"tool_calls": [delta]}),
            None,
            None,
        );
        self.pending.push_back(chunk.to_string());
    }

    /// Completes the calls of choice `index`'s final `answer`: each one's arguments as the
    /// model wrote them (as the final list parsed them, if the text has no such call).
    fn send_rest_of_calls(&mut self, index: usize, answer: &crate::prompt::Answer, done: &Done) {
        let text = self.s.tokenizer.decode(&done.decoded.generated_ids);
        let scanned = partial_calls(self.stops.cut(&text).0);
        for (i, call) in answer.function_calls().iter().enumerate() {
            let name = call.get("name").and_then(Value::as_str).unwrap_or_default();
            let parsed = call.get("arguments").cloned().unwrap_or_else(|| json!({}));
            let arguments = match scanned.get(i) {
                Some(c) if c.name.as_deref() == Some(name) => c.arguments.map(str::to_string),
                _ => None,
            };
            let arguments = arguments.unwrap_or_else(|| parsed.to_string());
            self.send_call_text(index, i, name, &arguments);
        }
    }

    fn fail(&mut self, why: &str) {
        self.pending
            .push_back(response::error(why, "server_error", None).to_string());
        self.end();
    }

    fn end(&mut self) {
        self.s.metrics.request_done(self.decoder.arrived.elapsed());
        self.pending.push_back("[DONE]".to_string());
        self.finished = true;
    }
}

package drill

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/anthropics/anthropic-sdk-go/v2"
	aoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	ooption "github.com/openai/openai-go/v3/option"

	"github.com/failbus/failbus/pkg/agent"
	"github.com/failbus/failbus/pkg/agent/anthropicevidence"
	"github.com/failbus/failbus/pkg/agent/openaievidence"
)

// Models the fleet calls on the chaos server (any name is accepted).
const (
	openAIModel    = "gpt-4.1-mini"
	anthropicModel = "claude-sonnet-4-5"
	// maxTokens is the output budget of every call.
	maxTokens = 512
)

// sdks are one strategy's clients: openai-go for the OpenAI provider,
// anthropic-sdk-go for the Anthropic one, each with its retries as the
// strategy wants them, recording every attempt in the ledger.
type sdks struct {
	openai    openai.Client
	anthropic anthropic.Client
	models    map[string]string
	keys      func(agent, provider, profile string) string
}

// newSDKs builds the clients. retries < 0 keeps each SDK's default (two);
// base URLs and models come from the chaos server or from real.
func newSDKs(l *ledger, retries int, openaiURL, anthropicURL string, real *Real) *sdks {
	// One transport for all: an SDK's default keeps two idle connections
	// per host, and a fleet of hundreds would open and close one per call.
	hc := &http.Client{Transport: &http.Transport{
		Proxy:               http.ProxyFromEnvironment,
		DialContext:         (&net.Dialer{Timeout: 30 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        2048,
		MaxIdleConnsPerHost: 1024,
		IdleConnTimeout:     90 * time.Second,
	}}
	oopts := []ooption.RequestOption{ooption.WithHTTPClient(hc), ooption.WithMiddleware(l.middleware(ProviderOpenAI))}
	aopts := []aoption.RequestOption{aoption.WithHTTPClient(hc), aoption.WithMiddleware(l.middleware(ProviderAnthropic))}
	if openaiURL != "" {
		oopts = append(oopts, ooption.WithBaseURL(openaiURL))
	}
	if anthropicURL != "" {
		aopts = append(aopts, aoption.WithBaseURL(anthropicURL))
	}
	if retries >= 0 {
		oopts = append(oopts, ooption.WithMaxRetries(retries))
		aopts = append(aopts, aoption.WithMaxRetries(retries))
	}
	s := &sdks{
		openai: openai.NewClient(oopts...), anthropic: anthropic.NewClient(aopts...),
		models: map[string]string{ProviderOpenAI: openAIModel, ProviderAnthropic: anthropicModel},
		keys:   Key,
	}
	if real != nil {
		if real.OpenAIModel != "" {
			s.models[ProviderOpenAI] = real.OpenAIModel
		}
		if real.AnthropicModel != "" {
			s.models[ProviderAnthropic] = real.AnthropicModel
		}
		s.keys = func(_, provider, profile string) string { return real.Keys[provider][profile] }
	}
	return s
}

// message is one turn of a conversation.
type message struct {
	role string // system, user or assistant
	text string
}

// answer is what one call got back.
type answer struct {
	text string
	// refused is the stop reason of an answer the provider refused
	// (content_filter, refusal); "" for an answer.
	refused string
}

// stream makes one streamed call to provider and returns its answer;
// emit (may be nil) gets each delta of text as it arrives.
func (s *sdks) stream(ctx context.Context, provider, model, key string, conv []message, emit func(string)) (answer, error) {
	if model == "" {
		model = s.models[provider]
	}
	if provider == ProviderAnthropic {
		return s.streamAnthropic(ctx, model, key, conv, emit)
	}
	return s.streamOpenAI(ctx, model, key, conv, emit)
}

func (s *sdks) streamOpenAI(ctx context.Context, model, key string, conv []message, emit func(string)) (answer, error) {
	msgs := make([]openai.ChatCompletionMessageParamUnion, 0, len(conv))
	for _, m := range conv {
		switch m.role {
		case "system":
			msgs = append(msgs, openai.SystemMessage(m.text))
		case "assistant":
			msgs = append(msgs, openai.AssistantMessage(m.text))
		default:
			msgs = append(msgs, openai.UserMessage(m.text))
		}
	}
	st := s.openai.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
		Model: model, Messages: msgs, MaxCompletionTokens: openai.Int(maxTokens),
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	}, ooption.WithAPIKey(key))
	defer st.Close()
	var acc openai.ChatCompletionAccumulator
	for st.Next() {
		chunk := st.Current()
		acc.AddChunk(chunk)
		if len(chunk.Choices) > 0 && chunk.Choices[0].Delta.Content != "" && emit != nil {
			emit(chunk.Choices[0].Delta.Content)
		}
	}
	if err := st.Err(); err != nil {
		return answer{}, err
	}
	if len(acc.Choices) == 0 {
		return answer{}, errors.New("openai: the stream ended without a choice")
	}
	c := acc.Choices[0]
	if c.FinishReason == "content_filter" {
		return answer{refused: c.FinishReason}, nil
	}
	return answer{text: c.Message.Content}, nil
}

func (s *sdks) streamAnthropic(ctx context.Context, model, key string, conv []message, emit func(string)) (answer, error) {
	params := anthropic.MessageNewParams{Model: anthropic.Model(model), MaxTokens: maxTokens}
	for _, m := range conv {
		switch m.role {
		case "system":
			params.System = append(params.System, anthropic.TextBlockParam{Text: m.text})
		case "assistant":
			params.Messages = append(params.Messages, anthropic.NewAssistantMessage(anthropic.NewTextBlock(m.text)))
		default:
			params.Messages = append(params.Messages, anthropic.NewUserMessage(anthropic.NewTextBlock(m.text)))
		}
	}
	st := s.anthropic.Messages.NewStreaming(ctx, params, aoption.WithAPIKey(key))
	defer st.Close()
	var msg anthropic.Message
	for st.Next() {
		ev := st.Current()
		if err := msg.Accumulate(ev); err != nil {
			return answer{}, fmt.Errorf("anthropic: %w", err)
		}
		if ev.Type == "content_block_delta" && ev.Delta.Text != "" && emit != nil {
			emit(ev.Delta.Text)
		}
	}
	if err := st.Err(); err != nil {
		return answer{}, err
	}
	if msg.StopReason == anthropic.StopReasonRefusal {
		return answer{refused: string(msg.StopReason)}, nil
	}
	text := ""
	for _, b := range msg.Content {
		text += b.Text
	}
	return answer{text: text}, nil
}

// describe reads either SDK's errors as evidence for Call.
func describe(err error) (agent.Evidence, bool) {
	if ev, ok := openaievidence.Describe(err); ok {
		return ev, true
	}
	return anthropicevidence.Describe(err)
}

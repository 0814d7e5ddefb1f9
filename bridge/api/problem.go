package api

import (
	"errors"
	"fmt"
	"log/slog"
	"net/http"

	"github.com/labstack/echo/v4"

	"github.com/vgpu-bridge/vgpu-bridge/internal/logkey"
)

// ProblemContentType is RFC 9457's media type for error answers.
const ProblemContentType = "application/problem+json"

// InvalidParam names one field that failed validation.
type InvalidParam struct {
	Name   string `json:"name"`
	Reason string `json:"reason"`
}

// ProblemDetails is an RFC 9457 error answer.
type ProblemDetails struct {
	Type          string         `json:"type,omitempty"`
	Title         string         `json:"title"`
	Status        int            `json:"status"`
	Detail        string         `json:"detail,omitempty"`
	Instance      string         `json:"instance,omitempty"`
	Code          string         `json:"code,omitempty"`
	RequestID     string         `json:"request_id,omitempty"`
	InvalidParams []InvalidParam `json:"invalid_params,omitempty"`
	// FirstRequestID and StatusURL name the bridge request a refused
	// retry made the first time (a webhook body sent again: 409
	// replayed), so that its sender can follow it.
	FirstRequestID string `json:"first_request_id,omitempty"`
	StatusURL      string `json:"status_url,omitempty"`
	// PolicyRule names the access rule that refused a caller (403), as
	// /v1/openapi.json's x-vgpu-policy and [oslo_policy] policy_file do.
	PolicyRule string `json:"policy_rule,omitempty"`
	// Headers are added to the answer (e.g. Retry-After); not serialised.
	Headers map[string]string `json:"-"`
}

func (p *ProblemDetails) Error() string {
	if p.Detail != "" {
		return fmt.Sprintf("%d %s: %s", p.Status, p.Title, p.Detail)
	}
	return fmt.Sprintf("%d %s", p.Status, p.Title)
}

// Problem returns an error that the server answers as problem+json.
func Problem(status int, title, detail string) *ProblemDetails {
	return &ProblemDetails{Status: status, Title: title, Detail: detail}
}

// ValidationProblem is a 422 naming every invalid field.
func ValidationProblem(params []InvalidParam) *ProblemDetails {
	return &ProblemDetails{Status: http.StatusUnprocessableEntity, Title: "Invalid request",
		Detail: fmt.Sprintf("%d invalid field(s)", len(params)), Code: "invalid_params", InvalidParams: params}
}

// WriteProblem writes p as the answer of c.
func WriteProblem(c echo.Context, p *ProblemDetails) error {
	if p.Title == "" {
		p.Title = http.StatusText(p.Status)
	}
	if p.Instance == "" {
		p.Instance = c.Request().URL.Path
	}
	if p.RequestID == "" {
		p.RequestID = RequestID(c)
	}
	for k, v := range p.Headers {
		c.Response().Header().Set(k, v)
	}
	c.Response().Header().Set(echo.HeaderContentType, ProblemContentType)
	c.Response().WriteHeader(p.Status)
	return jsonEncode(c.Response(), p)
}

func (s *Server) errorHandler(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	var p *ProblemDetails
	var he *echo.HTTPError
	switch {
	case errors.As(err, &p):
	case errors.As(err, &he):
		detail := ""
		if m, ok := he.Message.(string); ok && m != http.StatusText(he.Code) {
			detail = m
		}
		p = &ProblemDetails{Status: he.Code, Title: http.StatusText(he.Code), Detail: detail}
		if he.Code == http.StatusMethodNotAllowed {
			// echo has set Allow: the methods the route takes.
			p.Code = "method_not_allowed"
			p.Detail = "this route takes " + c.Response().Header().Get(echo.HeaderAllow)
		}
	default:
		s.log.ErrorContext(c.Request().Context(), "request failed", slog.String(logkey.RequestID, RequestID(c)),
			slog.String("path", c.Request().URL.Path), slog.Any("err", err))
		p = &ProblemDetails{Status: http.StatusInternalServerError, Title: "Internal Server Error",
			Detail: "the server failed; the log holds the details under this request_id"}
	}
	// HEAD gets the same status and headers (problem+json, Allow on a
	// 405); net/http drops the body.
	if werr := WriteProblem(c, p); werr != nil {
		s.log.Debug("write problem", "err", werr)
	}
}

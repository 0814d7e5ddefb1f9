package placementapi

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/vgpu-bridge/vgpu-bridge/bridge/api"
	"github.com/vgpu-bridge/vgpu-bridge/bridge/requests"
	"github.com/vgpu-bridge/vgpu-bridge/placement"
)

// RetypeRequest is the body of POST /v1/hosts/{name}/gpus/{pci}/retype.
type RetypeRequest struct {
	TypeID string `json:"type_id"`
}

// RetypeResult is its answer: the GPU's type now.
type RetypeResult struct {
	Host   string `json:"host"`
	PCI    string `json:"pci"`
	TypeID string `json:"type_id"`
	Step   string `json:"step"`
}

// retype re-types an empty bridge-owned GPU (placement.Service.Retype)
// and audits it (gpu.retype).
func (h *Handlers) retype(c echo.Context) error {
	host, pf := c.Param("name"), strings.ToLower(c.Param("pci"))
	var req RetypeRequest
	if err := api.DecodeJSON(c, &req); err != nil {
		return err
	}
	if !placement.ValidTypeID(req.TypeID) {
		return api.ValidationProblem([]api.InvalidParam{{Name: "type_id", Reason: "must be a numeric vendor-VFIO type id (a VF GPU), e.g. 1430, or an mdev type id (an mdev GPU), e.g. nvidia-230"}})
	}
	ctx, cancel := context.WithTimeout(c.Request().Context(), 2*time.Minute)
	defer cancel()
	from, _, err := h.svc.OwnedType(ctx, host, pf)
	if err == nil {
		err = h.svc.Retype(ctx, host, pf, req.TypeID)
	}
	switch {
	case errors.Is(err, placement.ErrRetypeNotOwned):
		return api.Problem(http.StatusNotFound, "GPU not bridge-owned", err.Error())
	case errors.Is(err, placement.ErrRetypeInUse):
		return api.Problem(http.StatusConflict, "GPU in use", err.Error())
	case errors.Is(err, placement.ErrRetypeBusy):
		return api.Problem(http.StatusConflict, "Re-type in progress", err.Error())
	case errors.Is(err, placement.ErrRetypeNotCreatable):
		return api.Problem(http.StatusUnprocessableEntity, "Type not creatable", err.Error())
	case err != nil:
		return api.Problem(http.StatusBadGateway, "Re-type failed", err.Error())
	}
	typ, step, err := h.svc.OwnedType(ctx, host, pf)
	if err != nil {
		return err
	}
	who := "anonymous"
	if p := api.PrincipalFrom(c); p != nil && p.Name != "" {
		who = p.Name
	}
	rid := api.RequestID(c)
	if err := requests.Audit(ctx, h.svc.Store().Pool(), requests.Entry{Actor: who, Action: "gpu.retype", ObjectType: "gpu",
		ObjectID: host + "/" + pf, RequestID: rid, GlobalRequestID: rid,
		Detail: map[string]string{"from": from, "to": typ}}); err != nil {
		return err
	}
	return c.JSON(http.StatusOK, RetypeResult{Host: host, PCI: pf, TypeID: typ, Step: step})
}
